"""The table and plots of benchmarks/time_to_quality.py, from the folders its stages wrote:
``results.md`` and ``results.json`` (every figure), ``quality_vs_time.png`` (a panel per rate) and
``quality_vs_bytes.png``. What did not run is said so in the table, never left out."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from time_to_quality import (
    RATES_MBPS,
    ROWS,
    evaluation_noise,
    load_results,
    markdown,
    quarter_gain,
    step_seconds,
    step_time_table,
    table_rows,
    target_quality,
)


def ddp_reference(results: dict, n_steps: int) -> dict:
    """The target (DDP's quality at N, averaged over its seeds) and the two checks on N and on
    the validation set: DDP's gain over its last quarter, one evaluation's scatter."""
    runs = results["ddp"]
    qualities = [target_quality(r["steps"], r["losses"], n_steps) for r in runs]
    late = [[v for s, v in zip(r["steps"], r["losses"]) if s > n_steps // 2] for r in runs]
    return {"target": statistics.mean(qualities), "per_seed": qualities,
            "quarter_gain": [quarter_gain(r["steps"], r["losses"], n_steps) for r in runs],
            "evaluation_noise": [evaluation_noise(v) for v in late]}


def plot(out: Path, results: dict, compute: dict, workers: int, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(RATES_MBPS), figsize=(5 * len(RATES_MBPS), 4), sharey=True)
    fig_b, ax_b = plt.subplots(figsize=(6, 4))
    colours = plt.get_cmap("tab20")  # a colour per row (tab10 repeats after ten rows)
    for i, row in enumerate(ROWS):
        runs, cost = results.get(row.key), compute.get(row.key)
        if not runs or cost is None:
            continue
        run = runs[0]
        if row.key == "ddp":  # the reference of the targets: DDP on a network of zero cost
            for ax in axes:
                ax.plot([s * cost["compute_s"] for s in run["steps"]], run["losses"], color="grey", ls=":",
                        label="DDP, network of zero cost")
        for ax, mbps in zip(axes, RATES_MBPS):
            t = step_seconds(row, cost["compute_s"], cost["backward_s"], run["payload_bytes"], workers, mbps)
            ax.plot([s * t for s in run["steps"]], run["losses"], label=row.label, color=colours(i))
        ax_b.plot([max(b, 1) / 1e6 for b in run["bytes"]], run["losses"], label=row.label, color=colours(i))
    for ax, mbps in zip(axes, RATES_MBPS):
        ax.axhline(target, color="k", lw=0.8, ls="--")
        ax.set(xscale="log", title=f"{mbps:g} Mbit/s, {workers} workers", xlabel="modelled time (s)")
    axes[0].set_ylabel("validation loss")
    low = min(min(r[0]["losses"]) for r in results.values())
    axes[0].set_ylim(low * 0.98, target * 1.4)
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"quality_vs_time_w{workers}.png", dpi=110)
    ax_b.axhline(target, color="k", lw=0.8, ls="--")
    ax_b.set(xscale="log", xlabel="MB sent, all workers (ledger)", ylabel="validation loss",
             ylim=(low * 0.98, target * 1.4), title=f"{workers} workers")
    ax_b.legend(fontsize=7)
    fig_b.tight_layout()
    fig_b.savefig(out / f"quality_vs_bytes_w{workers}.png", dpi=110)
    plt.close("all")


def write_report(out: Path, workers: list[int], seeds: list[int], lrs: dict, n_steps: int) -> None:
    compute = json.loads((out / "compute.json").read_text()) if (out / "compute.json").exists() else {}
    text = [f"# Time to DDP's quality (N = {n_steps}; seeds {seeds}; learning rates: "
            + ("untuned, every row at " + f"{lrs['untuned']:g}" if "untuned" in lrs else "tuned, tuning.json") + ")\n"]
    everything = {"n_steps": n_steps, "seeds": seeds, "lrs": lrs, "compute": compute, "workers": {}}
    for w in workers:
        results = load_results(out, w, seeds, lrs)
        if "ddp" not in results:
            text.append(f"\n### {w} workers: not run (no DDP curve, so no target)\n")
            continue
        ref = ddp_reference(results, n_steps)
        lines = table_rows(ref["target"], results, compute, w)
        text.append(markdown(lines, w, ref["target"]))
        text.append(f"\nDDP over its last quarter improves {', '.join(f'{g:.2%}' for g in ref['quarter_gain'])} "
                    f"(per seed); one evaluation scatters {', '.join(f'{e:.2%}' for e in ref['evaluation_noise'])}.\n")
        everything["workers"][str(w)] = {"reference": ref, "rows": lines}
        plot(out, results, compute, w, ref["target"])
    if "ddp" in compute:
        text.append("\n### The time model alone: step time / DDP's step on a network of zero cost\n\n"
                    + step_time_table(compute))
    (out / "results.md").write_text("".join(text))
    (out / "results.json").write_text(json.dumps(everything, indent=1, default=str) + "\n")
    print("".join(text))
