"""The figures of a comparison's tables from its runs' summaries (report/compare.py): megabytes are
10^6 bytes, and a run that did not finish enters no figure over the seeds."""

import pytest

from gradwire.report.compare import _fmt, row_of, seed_rows


def summary(status: str, acc: float, loss: float, mb: float, t: float) -> dict:
    return {"label": "v", "status": status, "steps": 10, "bytes_sent": int(mb * 1e6), "sim_time_s": t,
            "final": {"test_acc": acc, "test_loss": loss, "train_loss": loss}}


def test_a_row_gives_megabytes_as_millions_of_bytes():
    assert row_of(summary("finished", 0.5, 1.0, 2.5, 3.0))["mb_sent"] == pytest.approx(2.5)


def test_a_run_that_did_not_finish_enters_no_figure_over_the_seeds():
    base = [summary("finished", 0.50, 1.0, 1.0, 1.0), summary("finished", 0.60, 0.8, 1.0, 1.0),
            summary("finished", 0.70, 0.6, 1.0, 1.0)]
    other = [summary("finished", 0.55, 0.9, 2.0, 2.0), summary("stopped", 0.10, 9.0, 0.5, 0.5),
             summary("finished", 0.77, 0.5, 2.0, 4.0)]
    rows = seed_rows([0, 1, 2], ["base", "other"], [base, other])
    row = rows[1]
    assert row["finished"] == 2 and row["mb_sent"] == pytest.approx(2.0) and row["sim_time_s"] == pytest.approx(3.0)
    assert row["test_acc_mean"] == pytest.approx((0.55 + 0.77) / 2)
    assert (row["test_acc_min"], row["test_acc_max"]) == (0.55, 0.77)
    # paired with the first variant's run of the same seed, seeds 0 and 2 only: +10 % and +10 %
    assert row["test_acc_vs_first_pct"] == pytest.approx(10.0)
    assert rows[0]["test_acc_sd"] == pytest.approx(0.1)


def test_a_cell_goes_to_scientific_notation_below_a_thousandth():
    """comparison.md's numbers: 4 significant figures from 1e-3 up, and 4 in scientific notation below
    (0.0005 would read as one figure)."""
    assert _fmt(1e-3) == "0.001" and _fmt(9.99e-4) == "9.990e-04"
    assert _fmt(5e-4) == "5.000e-04" and _fmt(-5e-4) == "-5.000e-04" and _fmt(0.0) == "0"
    assert _fmt(2.345678) == "2.346"


def test_the_paired_difference_gives_its_least_and_greatest_over_the_seeds():
    base = [summary("finished", 0.5, loss, 1.0, 1.0) for loss in (1.0, 1.0, 1.0)]
    other = [summary("finished", 0.5, loss, 1.0, 1.0) for loss in (1.1, 0.9, 1.3)]
    row = seed_rows([0, 1, 2], ["base", "other"], [base, other])[1]
    # per seed: +10 %, -10 %, +30 %
    assert row["train_loss_vs_first_pct"] == pytest.approx(10.0)
    assert row["train_loss_vs_first_min_pct"] == pytest.approx(-10.0)
    assert row["train_loss_vs_first_max_pct"] == pytest.approx(30.0)
