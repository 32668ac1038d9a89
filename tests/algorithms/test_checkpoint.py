"""Checkpoints: a run stopped at step k and resumed ends bitwise identical to the run that never
stopped; bad checkpoints give clear errors."""

import json

import pytest
import torch

from gradwire.errors import ConfigError
from gradwire.run.loop import run
from tests.helpers import final_checkpoint, read_jsonl, states_equal

# 30 steps with a checkpoint every 10; make_config's out= names each run's folder
CHECKPOINTED = dict(task="digits-mlp", workers=3, steps=30, eval_every=5, lr=0.05, momentum=0.9,
                    stragglers="lognormal:sigma=0.5", checkpoint_every=10)


def _metrics(folder):
    rows = read_jsonl(folder / "metrics.jsonl")
    for r in rows:
        r.pop("wall_time_s"), r.pop("eval_time_s")
    return rows


@pytest.mark.parametrize("kw", [
    dict(algorithm="sync:backups=1", compressor="qsgd:levels=4", error_feedback=True),
    dict(algorithm="diana", compressor="pquant:p=2,block=32"),
    dict(algorithm="async", lr=0.02, compressor="topk:ratio=0.1", error_feedback=True),
    # constant: the "crash" below is a run of fewer --steps, which a decaying rate (signSGD's default) refuses to
    # resume, since its schedule spans --steps (test_signsgd.py resumes signSGD under schedules)
    dict(algorithm="signsgd:momentum=0.9", lr=0.005, lr_schedule="constant", momentum=0.0),  # Signum's own β
])
def test_resume_is_bitwise_exact(make_config, tmp_path, kw):
    run(make_config(CHECKPOINTED, out="whole", **kw), progress=False)
    run(make_config(CHECKPOINTED, out="split", steps=25, **kw), progress=False)  # "crashes" after step 25
    assert (tmp_path / "split" / "checkpoint" / "latest").read_text().strip() == "step-00000020"
    summary = run(make_config(CHECKPOINTED, out="split", resume=True, **kw), progress=False)
    assert summary["resumed"]
    assert states_equal(final_checkpoint(tmp_path / "whole")["state"], final_checkpoint(tmp_path / "split")["state"])
    assert _metrics(tmp_path / "whole") == _metrics(tmp_path / "split")


def test_resume_without_checkpoint_is_refused_and_resume_or_start_starts_fresh(make_config, tmp_path):
    with pytest.raises(ConfigError, match=r"nothing to resume: run folder .*fresh does not exist.*--resume-or-start"):
        run(make_config(CHECKPOINTED, out="fresh", resume=True, steps=5), progress=False)
    assert not (tmp_path / "fresh").exists()  # nothing made
    s = run(make_config(CHECKPOINTED, out="fresh", resume_or_start=True, steps=5), progress=False)
    assert not s["resumed"] and s["steps"] == 5


def test_mismatched_checkpoint_names_the_difference(make_config):
    run(make_config(CHECKPOINTED, out="a", steps=10), progress=False)
    with pytest.raises(ConfigError, match=r"lr: checkpoint 0.05 vs now 0.1"):
        run(make_config(CHECKPOINTED, out="a", steps=20, lr=0.1, resume=True), progress=False)
    with pytest.raises(ConfigError, match=r"nesterov: checkpoint False vs now True"):
        run(make_config(CHECKPOINTED, out="a", steps=20, momentum=0.9, nesterov=True, resume=True), progress=False)


def test_checkpoint_from_before_a_key_was_added_reads_as_its_default(make_config, tmp_path, monkeypatch):
    from gradwire import checkpoint

    monkeypatch.setattr(checkpoint, "MUST_MATCH", tuple(k for k in checkpoint.MUST_MATCH if k != "nesterov"))
    run(make_config(CHECKPOINTED, out="old", steps=10), progress=False)  # written without the key
    monkeypatch.undo()
    assert run(make_config(CHECKPOINTED, out="old", steps=20, resume=True), progress=False)["resumed"]
    with pytest.raises(ConfigError, match=r"nesterov: checkpoint False vs now True"):
        run(make_config(CHECKPOINTED, out="old", steps=30, momentum=0.9, nesterov=True, resume=True), progress=False)


def test_corrupt_checkpoint_is_a_clear_error(make_config, tmp_path):
    run(make_config(CHECKPOINTED, out="c", steps=10), progress=False)
    f = tmp_path / "c" / "checkpoint" / "step-00000010" / "sim.pt"
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    with pytest.raises(ConfigError, match="unreadable .corrupt or truncated."):
        run(make_config(CHECKPOINTED, out="c", steps=20, resume=True), progress=False)


def test_checkpoint_refuses_pickled_code(make_config, tmp_path):
    run(make_config(CHECKPOINTED, out="p", steps=10), progress=False)
    f = tmp_path / "p" / "checkpoint" / "step-00000010" / "sim.pt"

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"format": 1, "evil": Evil()}, f)
    with pytest.raises(ConfigError, match="unreadable"):
        run(make_config(CHECKPOINTED, out="p", steps=20, resume=True), progress=False)


# The state layout of one process's checkpoint as gradwire wrote it before the run's drivers
# (servers/driver.py) and checkpointer (run/checkpointer.py) were split out of run/loop.py: the
# run's entries, and the simulated server's beside them in server mode.
LAYOUT = {"step", "gradients", "window", "algorithm", "data", "clock", "gradient_counts", "transport"}


@pytest.mark.parametrize("algorithm, driver_entries", [("sync", set()), ("async", {"simulated_server"})])
def test_a_checkpoint_of_the_earlier_layout_resumes_bitwise(make_config, algorithm, driver_entries):
    from gradwire import checkpoint
    from gradwire.run.loop import Run

    cfg = make_config(algorithm=algorithm, steps=6, checkpoint_every=3)
    straight = Run(cfg)
    infos = [straight.train_step() for _ in range(6)]
    first = Run(cfg)
    for _ in range(3):
        first.train_step()
    state = first.state_dict()
    assert set(state) == LAYOUT | driver_entries
    # written piece by piece as the earlier run loop did, not through the checkpointer
    earlier = {"step": first.step, "gradients": first.gradients, "window": list(first.window),
               "algorithm": first.algorithm.state_dict(), "data": first.oracle.state_dict(),
               "clock": first.clock.state_dict(),
               "gradient_counts": {str(k): v for k, v in first.ctx.gradient_counts.items()},
               "transport": first.transport.state_dict()} | {k: state[k] for k in driver_entries}
    folder = first.checkpointer.folder
    checkpoint.save(folder, 3, "sim", earlier, first.cfg.to_dict(), elapsed={"wall_time_s": 1.5, "eval_time_s": 0.5})
    resumed = Run(cfg.replace(resume=True))
    assert resumed.resume() and resumed.step == 3 and resumed.eval_s == 0.5
    assert [resumed.train_step() for _ in range(3)] == infos[3:]
    assert torch.equal(resumed.algorithm.eval_params(), straight.algorithm.eval_params())


def test_a_resume_whose_algorithm_now_resolves_otherwise_is_refused(make_config, tmp_path):
    """A gradwire whose defaults changed (MuLoCo's outer momentum 0.5 -> 0.7 in 2026-11) must not
    continue an older checkpoint with other settings and overwrite config.json's record of them."""
    cfg = make_config(algorithm="muloco:inner_steps=2", task="digits-mlp", lr=0.003, steps=4, checkpoint_every=2,
                      out="m")
    run(cfg, progress=False)
    recorded = tmp_path / "m" / "config.json"
    config = json.loads(recorded.read_text())
    old = config["algorithm_resolved"].replace("outer_momentum=0.7", "outer_momentum=0.5")
    assert old != config["algorithm_resolved"]
    recorded.write_text(json.dumps(config | {"algorithm_resolved": old}))
    before = recorded.read_bytes()
    with pytest.raises(ConfigError, match=r"ran algorithm '.*outer_momentum=0\.5.*', which this gradwire resolves "
                                          r"to '.*outer_momentum=0\.7.*' \(its defaults changed\)"):
        run(cfg.replace(steps=6, resume=True), progress=False)
    assert recorded.read_bytes() == before  # the record of what ran is kept
    recorded.write_text(json.dumps(config))  # the same settings: it resumes
    assert run(cfg.replace(steps=6, resume=True), progress=False)["resumed_from_step"] == 4


def test_each_workers_gradient_count_comes_back_with_the_checkpoint(make_config):
    """A real backend sleeps each worker's straggler draw for its k-th gradient (``Context.gradient``);
    a resumed run goes on from each worker's count, not from 1, so the draws after the resume are
    those of a run never stopped."""
    from gradwire.run.loop import Run
    from tests.helpers import through_bytes

    cfg = make_config(algorithm="async", steps=6, checkpoint_every=3)
    first = Run(cfg)
    first.ctx.gradient_counts = {0: 5, 1: 9}  # unequal, as asynchronous workers' are
    again = Run(cfg)
    again.load_state_dict(through_bytes(first.state_dict()))
    assert again.ctx.gradient_counts == {0: 5, 1: 9}
