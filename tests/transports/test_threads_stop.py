"""The threads backend's stop: the error its main thread raises once every process thread has
ended names the checkpoint that --resume will continue from, whichever process stopped first."""

import signal

from gradwire import checkpoint
from gradwire.config import RunConfig
from gradwire.errors import Stopped
from gradwire.run.loop import threads_error


def stop(step: int, checkpoint_step: int | None, out: str | None) -> Stopped:
    e = Stopped(signal.SIGINT)
    e.step, e.checkpoint_step, e.out = step, checkpoint_step, out
    return e


def test_a_stop_read_before_the_writer_moved_latest_names_the_checkpoint_that_resumes(tmp_path):
    # process 1 stopped at step 1275 while process 0 (the writer, whose own error is missing) was still
    # moving `latest` to 1275: process 1 read 1250 (a new user's Ctrl-C on --backend threads)
    cfg = RunConfig(out=str(tmp_path), checkpoint_every=25)
    folder = tmp_path / "checkpoint"
    for step in (1250, 1275):
        checkpoint.save(folder, step, "rank0", {"x": step}, {k: None for k in checkpoint.MUST_MATCH}, keep=2)
    raised = threads_error(cfg, {1: stop(1275, 1250, None)})
    assert raised.checkpoint_step == 1275 and raised.step == 1275


def test_the_writers_stop_is_raised_first_and_without_a_checkpoint_none_is_named(tmp_path):
    cfg = RunConfig(out=str(tmp_path), checkpoint_every=0)
    first = stop(10, None, str(tmp_path))
    assert threads_error(cfg, {1: stop(11, None, None), 0: first}) is first
    assert first.checkpoint_step is None
    other = ValueError("a bug")
    assert threads_error(cfg, {2: stop(3, None, None), 1: other}) is other
