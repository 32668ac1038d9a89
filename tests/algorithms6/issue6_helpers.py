"""Shared by the issue-6 tests: small runs, and a checkpoint round trip through bytes."""

import io

import torch

from gradwire.config import RunConfig
from gradwire.run.loop import Run

TASK = "digits-mlp"


def config(tmp_path, data_dir, algorithm, **kw) -> RunConfig:
    base = dict(task=TASK, workers=4, algorithm=algorithm, partition="volumes:skew=8", steps=12, batch_size=16,
                lr=0.1, momentum=0.9, eval_every=6, seed=3, out=str(tmp_path / "run"), data_dir=str(data_dir))
    return RunConfig(**(base | kw))


def through_bytes(state):
    """What a checkpoint file gives back: a deep copy, loadable with weights_only=True."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def resume_matches(cfg: RunConfig, first: int, then: int) -> None:
    """Stopping after ``first`` steps, saving, and resuming in a fresh Run gives bit-identical
    parameters and step figures to running ``first + then`` steps without stopping."""
    straight = Run(cfg)
    infos = [straight.train_step() for _ in range(first + then)]
    a = Run(cfg)
    for _ in range(first):
        a.train_step()
    saved = through_bytes({"algorithm": a.algorithm.state_dict(), "data": a.oracle.state_dict()})
    b = Run(cfg)
    b.algorithm.load_state_dict(saved["algorithm"])
    b.oracle.load_state_dict(saved["data"])
    b.step = first
    resumed = [b.train_step() for _ in range(then)]
    assert torch.equal(b.algorithm.eval_params(), straight.algorithm.eval_params())
    assert resumed == infos[first:]
