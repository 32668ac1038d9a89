"""Every local-update algorithm (LSGD, EASGD, local SGD, DaSGD) checkpoints completely: stopping
mid-run, saving, loading into a fresh run and continuing gives the same numbers as never stopping
(checkpoints between and during rounds, with events in flight for the asynchronous variants and an
average in flight for DaSGD)."""

import io

import pytest
import torch

from gradwire.run.loop import Run
from tests.helpers import LOCAL_UPDATES

SPECS = [
    "lsgd",  # the authors' defaults: proximal pull, window τ/4, the average evaluated
    "lsgd:pull=0.3,period=3,prox=0,window=3,eval=leader",
    "lsgd:groups=2,pull=0.5,period=2,global_pull=0.2,global_period=3,prox=0.5,global_prox=0.3,eval=each",
    "lsgd:async=true,pull=0.3,period=2,prox=0.2",
    "lsgd:async=true,groups=2,period=1,global_period=2",
    "easgd:period=2",
    "easgd:period=2,eval=average",
    "easgd:async=true,period=2",
    "local:period=3",
    "local:period=3,eval=each",
    "dasgd:period=4,delay=3",   # the checkpoint at step 5 falls while the average of step 4 travels
    "dasgd:period=2,delay=2",   # always one in flight
    "dasgd:period=3,delay=1",   # none in flight at step 5
]


def only_tensors_and_ints(obj, where="state") -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert isinstance(k, str), f"{where}: key {k!r} is not a string"
            only_tensors_and_ints(v, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            only_tensors_and_ints(v, f"{where}[{i}]")
    else:
        assert isinstance(obj, torch.Tensor) or (isinstance(obj, int) and not isinstance(obj, bool)), \
            f"{where} is a {type(obj).__name__}"


def snapshot(r: Run) -> dict:
    r.algorithm.before_evaluation(r.ctx)  # what eval=average or each gathers: from the resumed state too
    return {"x": {k: t.clone() for k, t in r.algorithm.replicas.x.items()}, "eval": r.algorithm.eval_params().clone()}


@pytest.mark.parametrize("spec", SPECS)
def test_resume_mid_run_equals_never_stopping(make_config, spec):
    cfg = make_config(LOCAL_UPDATES, algorithm=spec)
    straight = Run(cfg)
    expected = [straight.train_step() for _ in range(12)]

    first = Run(cfg)
    for _ in range(5):
        first.train_step()
    only_tensors_and_ints(first.algorithm.state_dict(), spec)
    in_flight = getattr(first.algorithm, "started_at", -1) >= 0
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = Run(cfg)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    got = [resumed.train_step() for _ in range(7)]
    assert got == expected[5:]
    # saving had no side effect on the run that was saved
    assert [first.train_step() for _ in range(7)] == expected[5:]

    for r in (resumed, first):
        a, b = snapshot(straight), snapshot(r)
        assert torch.equal(a["eval"], b["eval"])
        assert all(torch.equal(a["x"][k], b["x"][k]) for k in a["x"])
    assert first.clock.now == straight.clock.now and first.transport.bytes_sent == straight.transport.bytes_sent
    # DaSGD starts an average in flight at the checkpoint again after the resume (the same snapshot),
    # counted once and finishing when it first would have: ledger, time and clock as if never stopped
    assert resumed.clock.now == straight.clock.now
    assert resumed.transport.bytes_sent == straight.transport.bytes_sent
    assert resumed.transport.comm_time_s == straight.transport.comm_time_s
    assert in_flight or not spec.startswith("dasgd:period=2")  # the case it is for does occur
