"""The table of docs/leader_sgd.md from the runs of examples/leader_sgd_protocol.yaml, one
``gradwire compare`` folder per seed: final and early test accuracy (mean and range over the
seeds), bytes, simulated time, and for LSGD how the leadership was shared.

    for s in 0 1 2; do gradwire compare --config examples/leader_sgd_protocol.yaml --seed $s \\
        --out runs/lsgd_protocol/seed$s; done
    python benchmarks/lsgd_protocol_table.py runs/lsgd_protocol/seed0 runs/lsgd_protocol/seed1 runs/lsgd_protocol/seed2

A folder that is a single run (``gradwire run``, e.g. LSGD on fixed shards) counts as one variant.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path

EARLY = (100, 250, 500)  # steps of the early-training columns


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def runs_of(root: Path) -> list[Path]:
    if (root / "summary.json").exists():
        return [root]
    return sorted(p for p in root.iterdir() if (p / "summary.json").exists())


def figures(run: Path) -> dict:
    metrics = {r["step"]: r for r in rows(run / "metrics.jsonl")}
    last = metrics[max(metrics)]
    out = {"final": last["test_acc"], "MB": last["bytes_sent"] / 1e6, "sim_s": last["sim_time_s"]}
    out |= {f"@{s}": metrics[s]["test_acc"] for s in EARLY if s in metrics}
    leaders = [r["leader"] for r in rows(run / "steps.jsonl") if "leader_loss" in r]
    if leaders:  # LSGD: the share of rounds its most frequent leader led
        out["top_leader_share"] = max(collections.Counter(leaders).values()) / len(leaders)
    return out


def cell(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main(roots: list[str]) -> None:
    table: dict[str, list[dict]] = {}
    for root in roots:
        for run in runs_of(Path(root)):
            label = json.loads((run / "summary.json").read_text())["label"]
            table.setdefault(label, []).append(figures(run))
    cols = ["final", *[f"@{s}" for s in EARLY], "MB", "sim_s", "top_leader_share"]
    names = {"final": "final test acc", "MB": "MB sent", "sim_s": "sim time (s)",
             "top_leader_share": "rounds led by the top leader", **{f"@{s}": f"test acc @{s}" for s in EARLY}}
    print("| variant | seeds | " + " | ".join(names[c] for c in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for label, runs in table.items():
        cells = [cell([r[c] for r in runs], 1 if c in ("MB", "sim_s") else 3) if all(c in r for r in runs) else "–"
                 for c in cols]
        print(f"| {label} | {len(runs)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
