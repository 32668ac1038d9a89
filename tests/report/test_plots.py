"""The curves' axes: a log scale only where the plotted values span at least a decade."""

from __future__ import annotations

import matplotlib.axes
import pytest

from gradwire.report import plots
from gradwire.report.plots import log_worthy, plot_runs, time_label


@pytest.mark.parametrize("values, expected", [
    ([5.6, 3.0, 2.2], False),        # a language model's loss: linear, no 3x10^0 tick labels
    ([2.3, 0.05], True),             # a convex objective falling 46-fold: log
    ([1.0, 10.0], True),             # exactly a decade: log
    ([1.0, 9.9], False),             # just short of one: linear
    ([0.0, -1.0, 5.0, 0.6], False),  # non-positive values are not plotted on a log axis
    ([], False),
])
def test_log_only_over_a_decade(values, expected):
    assert log_worthy(values) is expected


def records(losses):
    return [{"step": i, "bytes_sent": 1000 * i, "sim_time_s": 0.1 * i, "train_loss": loss, "test_acc": 0.5}
            for i, loss in enumerate(losses)]


def test_plot_uses_the_scale_the_values_ask_for(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    plot_runs({"a": records([5.6, 3.1, 2.2]), "b": records([5.6, 3.4, 2.5])}, tmp_path / "narrow.png")
    plot_runs({"a": records([5.6, 0.4, 0.02])}, tmp_path / "wide.png")
    narrow, wide = figures
    assert [ax.get_yscale() for ax in narrow.axes[:3]] == ["linear"] * 3  # the objective's row
    assert [ax.get_yscale() for ax in wide.axes[:3]] == ["log"] * 3
    assert (tmp_path / "narrow.png").stat().st_size > 1000


def test_the_test_loss_and_the_rate_have_a_row_where_the_runs_recorded_them(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    with_loss = [dict(r, test_loss=3.0 - 0.1 * r["step"]) if r["step"] else r for r in records([5.6, 3.1, 2.2])]
    plot_runs({"a": with_loss}, tmp_path / "lm.png")  # the first record has none: the others decide
    plot_runs({"a": records([5.6, 3.1, 2.2])}, tmp_path / "plain.png")
    plot_runs({"a": [dict(r, lr=0.1 / (1 + r["step"])) for r in records([5.6, 3.1, 2.2])]}, tmp_path / "lr.png")
    lm, plain, scheduled = figures
    assert [ax.get_ylabel() for ax in lm.axes[::3]] == ["training objective", "test loss", "test accuracy"]
    assert [ax.get_ylabel() for ax in plain.axes[::3]] == ["training objective", "test accuracy"]
    # a run under --lr-schedule: its rate, step by step
    assert [ax.get_ylabel() for ax in scheduled.axes[::3]] == ["training objective", "test accuracy", "learning rate"]
    assert list(scheduled.axes[6].lines[0].get_ydata()) == [0.1, 0.05, 0.1 / 3]


def test_a_range_over_seeds_is_shaded(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    banded = [dict(r, **{"train_loss:lo": r["train_loss"] - 0.1, "train_loss:hi": r["train_loss"] + 0.2})
              for r in records([5.6, 3.1, 2.2])]
    plot_runs({"mean": banded}, tmp_path / "band.png")
    plot_runs({"one": records([5.6, 3.1, 2.2])}, tmp_path / "line.png")
    band, line = figures
    assert [len(ax.collections) for ax in band.axes[:3]] == [1, 1, 1]  # the objective's row, every x-axis
    assert all(not ax.collections for ax in band.axes[3:])  # no range given for the accuracy
    assert all(not ax.collections for ax in line.axes)
    ys = band.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(2.1) and ys.max() == pytest.approx(5.8)  # from the least lo to the greatest hi


@pytest.mark.parametrize("backends, label", [
    (["sim", "sim"], "simulated time (s)"),
    ([], "simulated time (s)"),
    (["torch"], "elapsed time (s)"),
    (["sim", "torch"], "time (s): simulated on sim, elapsed otherwise"),
])
def test_the_time_axis_is_named_after_the_backends(backends, label):
    assert time_label(backends) == label


def test_a_band_reaching_zero_is_not_drawn_on_a_log_axis(tmp_path, monkeypatch):
    """The objective spans three decades (a log axis): a range over seeds whose least value is 0
    cannot be drawn there; the band is drawn over the other points only."""
    drawn = []
    real = matplotlib.axes.Axes.fill_between

    def fill_between(self, x, lo, hi, **kwargs):
        drawn.append((list(x), list(lo), list(hi)))
        return real(self, x, lo, hi, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", fill_between)
    recs = [dict(r, **{"train_loss:lo": lo, "train_loss:hi": 2 * r["train_loss"]})
            for r, lo in zip(records([10.0, 1.0, 0.01]), [5.0, 0.0, 0.005])]
    plot_runs({"mean": recs}, tmp_path / "band.png")
    assert len(drawn) == 3  # the objective's row, one band per x-axis
    for x, lo, hi in drawn:
        assert len(x) == 2 and min(lo) > 0 and lo == [5.0, 0.005] and hi == [20.0, 0.02]  # steps 0 and 2
