"""What both server-mode DiLoCos (backup-diloco, async-diloco: algorithms/outer_replicas.py) must
do alike: give the simulator's figures on the real driver with one replica, and resume bitwise."""

import pytest

from gradwire.run.loop import run
from tests.helpers import final_checkpoint, read_jsonl, states_equal

SPECS = ["backup-diloco:backups=0,inner_steps=2", "async-diloco:inner_steps=2"]


@pytest.mark.parametrize("spec", SPECS)
def test_simulator_and_real_driver_agree_with_one_replica(make_config, spec):
    base = make_config(algorithm=spec, workers=1, steps=6, eval_every=3, lr=0.01, stragglers="none:compute_s=0.001")
    assert_simulator_equals_threads(base)


def assert_simulator_equals_threads(base) -> None:
    """``base`` on the simulator and on the threads backend's real driver: the same metrics."""
    sim = run(base.replace(out=base.out + "-sim"), progress=False)
    real = run(base.replace(out=base.out + "-threads", backend="threads", timeout_s=30), progress=False)
    assert sim["status"] == real["status"] == "finished"
    keys = ("step", "bytes_sent", "train_loss", "test_loss", "test_acc")
    a, b = read_jsonl(base.out + "-sim/metrics.jsonl"), read_jsonl(base.out + "-threads/metrics.jsonl")
    assert [{k: x[k] for k in keys} for x in a] == [{k: x[k] for k in keys} for x in b]


@pytest.mark.parametrize("spec", ["backup-diloco:backups=1,inner_steps=2",
                                  "backup-diloco:backups=1,late=buffer,inner_steps=2",
                                  "backup-diloco:backups=1,late=stale,inner_steps=2",
                                  "async-diloco:inner_steps=2,period=2"])
def test_resume_is_bitwise_exact(make_config, tmp_path, spec):
    """Stopped at step 7 (a checkpoint at 6, with messages in flight under the tail stragglers) and
    resumed: the same state and metrics as the run that never stopped."""
    kw = dict(algorithm=spec, workers=3, steps=9, eval_every=3, lr=0.01, stragglers="tail:p=0.2,slowdown=10",
              checkpoint_every=3)
    run(make_config(out="whole", **kw), progress=False)
    run(make_config(out="split", **kw | dict(steps=7)), progress=False)
    summary = run(make_config(out="split", resume=True, **kw), progress=False)
    assert summary["resumed"]
    assert states_equal(final_checkpoint(tmp_path / "whole")["state"], final_checkpoint(tmp_path / "split")["state"])

    def metrics(folder):
        return [{k: v for k, v in m.items() if not k.endswith("time_s")} for m in read_jsonl(folder / "metrics.jsonl")]

    assert metrics(tmp_path / "whole") == metrics(tmp_path / "split")
    steps = read_jsonl(tmp_path / "whole" / "steps.jsonl")
    if "buffer" in spec:  # the tail made someone late: buffered into a later round
        assert any(s["buffered"] for s in steps)
    elif "stale" in spec:  # the tail made someone late: applied with its staleness, none dropped
        assert any(s["late"] for s in steps) and not any(s["dropped"] for s in steps)
    elif spec.startswith("backup"):  # the tail made someone late: dropped
        assert any(s["dropped"] for s in steps)
    else:  # nobody is dropped; the tail shows as staleness
        assert max(s["staleness_max"] for s in steps) > max(s["staleness_mean"] for s in steps) > 0
