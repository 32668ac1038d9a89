"""``benchmarks/time_to_accuracy.py``, from constructed results: its verdict on issue 13's three
conditions (3x faster than DDP, faster than PyTorch's PowerSGD hook, the fastest of its rows at any
rank, and a final loss within 1 % of DDP's), and a report that keeps every rate run into its folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_accuracy.py"


@pytest.fixture(scope="module")
def tta():
    return load_script(SCRIPT, "time_to_accuracy")


def row(key: str, kind: str, seconds: float | None, final: float) -> dict:
    return {"key": key, "rate": 100.0, "kind": kind, "family": "adamw", "label": key,
            "summary": {"final_loss": final, "targets": {"2.0": None if seconds is None else {"seconds": seconds}}}}


def write_runs(out: Path, runs: dict[tuple[float, str], list[dict]], **record) -> None:
    """Run folders under ``out`` as the benchmark leaves them: each (rate, key)'s metrics.jsonl
    rows, and results.json recording them (plus ``record``'s keys: seed, lr_schedule)."""
    for (rate, key), rows in runs.items():
        folder = out / f"{rate:g}mbps" / key
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = [{"rate": rate, "key": key, "wire_mb": 0.01, "drops": 0} for rate, key in runs]
    (out / "results.json").write_text(json.dumps({"results": records} | record))


def checks(text: str, key: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"- {key}:"))
    return [part.rsplit(" ", 1)[1] for part in line.split(": ", 1)[1].split("; ")]


def test_every_condition_met(tta):
    results = [row("ddp-adamw", "ddp", 300.0, 1.40), row("ddp-adamw-powersgd", "ddp", 150.0, 1.70),
               row("gw-adamw-powersgd32h", "gradwire", 99.0, 1.41)]
    # 3x DDP (same opt.), 3x best DDP (no SGD row: AdamW's), faster than the hook, within 1 %
    assert checks(tta.verdict(results, 100.0, 2.0), "gw-adamw-powersgd32h") == ["yes"] * 4


def test_the_hook_to_beat_is_the_fastest_of_its_rows(tta):
    base = [row("ddp-adamw", "ddp", 300.0, 1.40), row("ddp-adamw-powersgd", "ddp", 150.0, 1.70),
            row("gw-adamw-powersgd32h", "gradwire", 99.0, 1.41)]
    faster_hook = row("ddp-adamw-powersgd32h", "ddp", 95.0, 1.41)  # the hook at rank 32, sooner than us
    assert checks(tta.verdict(base + [faster_hook], 100.0, 2.0), "gw-adamw-powersgd32h")[2] == "no"
    unreached = row("ddp-adamw-powersgd32h", "ddp", None, 1.80)  # a hook row that never gets there
    assert checks(tta.verdict(base + [unreached], 100.0, 2.0), "gw-adamw-powersgd32h")[2] == "yes"


def test_each_condition_can_fail(tta):
    ddp, hook = row("ddp-adamw", "ddp", 300.0, 1.40), row("ddp-adamw-powersgd", "ddp", 150.0, 1.70)
    slow = row("gw-a", "gradwire", 101.0, 1.40)  # 2.97x
    worse = row("gw-b", "gradwire", 90.0, 1.40 * 1.011)  # 1.1 % above DDP
    never = row("gw-c", "gradwire", None, 1.40)
    text = tta.verdict([ddp, hook, slow, worse, never], 100.0, 2.0)
    assert checks(text, "gw-a") == ["no", "no", "yes", "yes"]
    assert checks(text, "gw-b") == ["yes", "yes", "yes", "no"]
    assert checks(text, "gw-c") == ["no", "no", "no", "yes"]
    assert checks(tta.verdict([ddp, slow], 100.0, 2.0), "gw-a")[2] == "n/a"  # no hook row ran


def test_a_later_run_at_another_rate_keeps_the_earlier_rate_in_the_report(tta, tmp_path, monkeypatch):
    """Running 1 Gbit/s into a folder that holds a 100 Mbit/s run reports both rates (the report
    used to cover only the rates of the latest command line)."""
    write_runs(tmp_path, {(rate, "ddp-adamw"): [{"step": s, "wall_time_s": 1.0 + s * step_s, "bytes_sent": s * 1000,
                                                 "test_loss": 3.0 - 0.5 * s} for s in range(3)]
                          for rate, step_s in ((100.0, 0.9), (1000.0, 0.2))})
    monkeypatch.setattr(sys, "argv", ["time_to_accuracy.py", "--report-only", "--rates", "1000", "--steps", "2",
                                      "--targets", "2.0", "--out", str(tmp_path)])
    assert tta.main() == 0
    text = (tmp_path / "results.md").read_text()
    assert "### 1000 Mbit/s" in text and "### 100 Mbit/s" in text
    assert {(r["rate"], r["key"]) for r in json.loads((tmp_path / "results.json").read_text())["results"]} == {
        (100.0, "ddp-adamw"), (1000.0, "ddp-adamw")}


def test_time_less_evaluations_is_measured_where_the_run_recorded_it(tta, tmp_path, monkeypatch):
    """"s to L less evals" subtracts the evaluation seconds a run recorded (``eval_time_s``, which
    ddp_train.py and ``gradwire run`` write); a run folder without them is estimated (≈) from the
    median of the runs that have them."""
    write_runs(tmp_path, {(100.0, key): [{"step": s, "wall_time_s": 1.0 + s * step_s, "bytes_sent": s * 1000,
                                          "test_loss": 3.0 - 0.5 * s}
                                         | ({} if eval_s is None else {"eval_time_s": s * eval_s}) for s in range(3)]
                          for key, step_s, eval_s in (("ddp-adamw", 0.9, 0.2), ("gw-adamw-powersgd32h", 0.3, 0.1),
                                                      ("gw-adamw-powersgd24h", 0.25, None))})
    monkeypatch.setattr(sys, "argv", ["time_to_accuracy.py", "--report-only", "--rates", "100", "--steps", "2",
                                      "--targets", "2.0", "--out", str(tmp_path)])
    assert tta.main() == 0
    lines = (tmp_path / "results.md").read_text().splitlines()
    head = next(x for x in lines if x.startswith("| variant"))
    column = [c.strip() for c in head.split("|")].index("s to 2.0 less evals")

    def cell(key: str) -> str:
        label = tta.BY_KEY[key].label
        return next([c.strip() for c in x.split("|")] for x in lines if x.startswith(f"| {label} |"))[column]

    # the target falls at step 2: 2 steps' time less the 2 evaluations before it (steps 0 and 1)
    assert cell("ddp-adamw") == "1.4"  # 1.8 s - 2 x 0.2 s
    assert cell("gw-adamw-powersgd32h") == "0.4"  # 0.6 s - 2 x 0.1 s
    assert cell("gw-adamw-powersgd24h") == "≈0.1"  # 0.5 s - 2 x the upper median of 0.1 and 0.2 s


def test_seed_reaches_every_row_and_one_folder_holds_one_seed(tta, tmp_path, monkeypatch, capsys):
    """``--seed`` goes to ddp_train.py and to ``gradwire run`` alike (a repeated run repeats its
    losses bit for bit: only another seed tests the loss conditions), and a folder holding runs of
    one seed refuses another, so that one table never mixes seeds."""
    monkeypatch.setattr(sys, "argv", ["time_to_accuracy.py", "--list", "--rates", "100", "--seed", "3",
                                      "--only", "ddp-adamw,gw-adamw-powersgd32h", "--out", str(tmp_path)])
    assert tta.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(" --seed 3 " in x and " --seed 0 " not in x for x in lines)
    assert "torchrun benchmarks/ddp_train.py" in lines[0] and " -- run " in lines[1]

    report = ["time_to_accuracy.py", "--report-only", "--rates", "100", "--seed", "1", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", report)
    assert tta.main() == 2  # a new folder takes any seed; it has nothing to report yet, and says so
    assert capsys.readouterr().err.strip() == f"time_to_accuracy.py: error: no finished run to report under {tmp_path}"
    (tmp_path / "results.json").write_text(json.dumps({"results": [], "seed": 0}))
    with pytest.raises(SystemExit) as stop:
        tta.main()
    assert stop.value.code == 2
    assert f"--seed 1: {tmp_path} holds runs of seed 0; pass --seed 0 or give another --out" in capsys.readouterr().err


def test_lr_schedule_reaches_every_row_and_one_folder_holds_one_schedule(tta, tmp_path, monkeypatch, capsys):
    """``--lr-schedule`` goes to ddp_train.py and to ``gradwire run`` alike, the constant default
    leaves the command lines as they were, a bad spec is one line before any run, and a folder of
    constant-rate runs refuses a schedule (one table, one schedule)."""
    listing = ["time_to_accuracy.py", "--list", "--rates", "100", "--steps", "1000", "--only",
               "ddp-adamw,gw-adamw-powersgd32h", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*listing, "--lr-schedule", "cosine:warmup=50,min_ratio=0.1"])
    assert tta.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(" --lr-schedule cosine:warmup=50,min_ratio=0.1 " in x for x in lines)
    monkeypatch.setattr(sys, "argv", listing)
    assert tta.main() == 0
    assert "--lr-schedule" not in capsys.readouterr().out

    monkeypatch.setattr(sys, "argv", [*listing, "--lr-schedule", "cosine:warmup=2000"])
    with pytest.raises(SystemExit) as stop:
        tta.main()
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err[-1].startswith("time_to_accuracy.py: error: --lr-schedule: ")
    assert "2000" in err[-1]

    (tmp_path / "results.json").write_text(json.dumps({"results": [], "seed": 0}))  # an older folder: constant
    monkeypatch.setattr(sys, "argv", ["time_to_accuracy.py", "--report-only", "--rates", "100", "--lr-schedule",
                                      "cosine:warmup=5", "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        tta.main()
    assert stop.value.code == 2
    assert (f"--lr-schedule cosine:warmup=5,min_ratio=0: {tmp_path} holds runs under constant; pass --lr-schedule "
            "constant or give another --out" in capsys.readouterr().err)


def test_a_folder_records_its_schedule_and_takes_the_same_one_spelt_otherwise(tta, tmp_path, monkeypatch):
    """The schedule is recorded in results.json in one spelling (every parameter, a fixed order), so
    the same schedule written another way is accepted and the report says which it was."""
    rows = [{"step": s, "wall_time_s": 1.0 + s, "bytes_sent": s * 1000, "test_loss": 3.0 - 0.5 * s} for s in range(3)]
    write_runs(tmp_path, {(100.0, "ddp-adamw"): rows}, lr_schedule="cosine:warmup=1,min_ratio=0.1")
    monkeypatch.setattr(sys, "argv", ["time_to_accuracy.py", "--report-only", "--rates", "100", "--steps", "2",
                                      "--targets", "2.0", "--lr-schedule", "cosine:min_ratio=0.1,warmup=1",
                                      "--out", str(tmp_path)])
    assert tta.main() == 0
    assert json.loads((tmp_path / "results.json").read_text())["lr_schedule"] == "cosine:warmup=1,min_ratio=0.1"
    assert "learning rate cosine:warmup=1,min_ratio=0.1," in (tmp_path / "results.md").read_text()


def test_the_table_gives_the_mean_of_the_last_five_evaluations_beside_the_final_one(tta, tmp_path, monkeypatch):
    """One final evaluation of the small validation set moves by several per cent between
    evaluations, so the table also compares the mean of the last five: a row whose last
    evaluation alone is off shows it in full in "Δ final", and a fifth of it in "Δ last 5"."""
    losses = {"ddp-adamw": [3.0, 2.0, 1.50, 1.40, 1.50, 1.40, 1.30],
              "gw-adamw-powersgd32h": [3.0, 2.0, 1.50, 1.40, 1.50, 1.40, 1.43]}
    write_runs(tmp_path, {(100.0, key): [{"step": s, "wall_time_s": 1.0 + s, "bytes_sent": s * 1000, "test_loss": loss}
                                         for s, loss in enumerate(curve)] for key, curve in losses.items()})
    monkeypatch.setattr(sys, "argv", ["time_to_accuracy.py", "--report-only", "--rates", "100", "--steps", "6",
                                      "--targets", "2.0", "--out", str(tmp_path)])
    assert tta.main() == 0
    lines = (tmp_path / "results.md").read_text().splitlines()
    head = [c.strip() for c in next(x for x in lines if x.startswith("| variant")).split("|")]
    row = [c.strip() for c in next(x for x in lines if x.startswith(f"| {tta.BY_KEY['gw-adamw-powersgd32h'].label} |"))
           .split("|")]
    assert row[head.index("Δ final vs DDP")] == "+10.0 %"  # 1.43 against 1.30
    assert row[head.index("Δ last 5 vs DDP")] == "+1.8 %"  # 7.23 / 5 against 7.10 / 5


def test_every_row_of_a_plot_has_its_own_colour(tta):
    """Up to 20 rows, no two share a colour, whatever their places among the variants (DDP and
    rank 64, 20 places apart, used to share one); a row keeps its colour across rates."""
    keys = [v.key for v in tta.VARIANTS]
    for chosen in (["ddp-adamw", "ddp-adamw-powersgd", "gw-adamw-powersgd32h", "gw-adamw-powersgd48h",
                    "gw-adamw-powersgd64h"], keys[:20]):
        colour = tta.colours(chosen + chosen)  # two rates: every key twice
        assert len(colour) == len(chosen) and len(set(colour.values())) == len(chosen)
