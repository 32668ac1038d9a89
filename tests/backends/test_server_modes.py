"""Server mode, one protocol and two drivers: the simulator's driver and the real one (here on the
threads backend, the code path of torch.distributed's processes in one process) run each
server-mode algorithm's protocol with the same arithmetic and the same bytes."""

import pytest
import torch

from gradwire.algorithms import ALGORITHMS
from gradwire.algorithms.base import Algorithm
from gradwire.algorithms.protocol import GRADIENT, HEADER_BYTES, PARAMS, Message
from gradwire.run.loop import Run, run
from gradwire.transports.base import SERVER
from tests.helpers import read_jsonl, through_bytes

SERVER_SPECS = ["async", "sync:backups=1", "easgd:async=true,period=2", "lsgd:async=true,period=2,pull=0.5",
                "lsgd:async=true,groups=2,period=1,pull=0.5,global_period=3"]
COMPARED = ("step", "bytes_sent", "gradients", "batch_loss", "train_loss", "test_loss", "test_acc")


@pytest.mark.parametrize("spec", SERVER_SPECS)
def test_every_server_mode_algorithm_declares_its_protocol(spec):
    algo = ALGORITHMS.build(spec)
    assert algo.needs_server
    cls = type(algo)
    for method in ("worker_step", "on_message", "worker_apply", "join_reply"):
        assert getattr(cls, method) is not getattr(Algorithm, method), method


@pytest.mark.parametrize("spec", ["async", "easgd:async=true,period=2", "lsgd:async=true,period=2,pull=0.5"])
def test_simulator_and_real_driver_agree_with_one_worker(make_config, spec):
    # one worker: the order of messages is fixed, so both drivers must compute the same numbers
    # and count the same bytes at every evaluation
    base = make_config(algorithm=spec, workers=1, steps=9, eval_every=3, stragglers="none:compute_s=0.001")
    sim = run(base.replace(out=base.out + "-sim"))
    real = run(base.replace(out=base.out + "-threads", backend="threads", timeout_s=30))
    assert sim["status"] == real["status"] == "finished"
    a, b = read_jsonl(base.out + "-sim/metrics.jsonl"), read_jsonl(base.out + "-threads/metrics.jsonl")
    assert [{k: r[k] for k in COMPARED} for r in a] == [{k: r[k] for k in COMPARED} for r in b]
    assert real["lost_workers"] == [] and real["local_steps"]["0"] >= 9


@pytest.mark.parametrize("spec", SERVER_SPECS)
def test_real_driver_runs_every_server_mode_algorithm(make_config, spec):
    cfg = make_config(algorithm=spec, workers=4, steps=8, eval_every=4, backend="threads", timeout_s=30,
                      stragglers="lognormal:sigma=0.5,compute_s=0.002")
    summary = run(cfg)
    assert summary["status"] == "finished" and summary["lost_workers"] == []
    steps = read_jsonl(cfg.out + "/steps.jsonl")
    assert [s["step"] for s in steps] == list(range(1, 9))
    need = 3 if spec == "sync:backups=1" else 4
    assert all(s["gradients"] == need for s in steps)  # sync takes N = 3 of 4; the others n reports a step
    # the server took exactly the computations the workers say they sent (each counted once)
    assert summary["gradients_received"] == summary["local_steps"]


def test_checkpoint_cut_resumes_on_the_real_driver(make_config):
    cfg = make_config(algorithm="easgd:async=true,period=2", workers=3, steps=6, eval_every=3, backend="threads",
                      timeout_s=30, checkpoint_every=3, resume_or_start=True, stragglers="none:compute_s=0.001")
    first = run(cfg)
    assert first["status"] == "finished"
    folder = cfg.out + "/checkpoint"
    latest = (torch.load(f"{folder}/step-00000006/rank0.pt", weights_only=True))["state"]
    held = [Message.from_state(m) for m in latest["server"]["held"]]
    assert sorted(m.worker for m in held) == [0, 1, 2]  # every worker's next message, held unanswered
    for m in held:  # ... and each worker's saved state stands right after it was sent
        worker = torch.load(f"{folder}/step-00000006/rank{m.worker + 1}.pt", weights_only=True)["state"]
        assert worker["worker_position"]["count"] == m.count
    second = run(cfg.replace(steps=12))
    assert second["status"] == "finished" and second["resumed"] and second["steps"] == 12
    assert [r["step"] for r in read_jsonl(cfg.out + "/metrics.jsonl")] == [0, 3, 6, 9, 12]


def test_simulated_server_prices_and_counts_every_message(make_config):
    # async with 2 workers on the simulator: every gradient message goes up (header + payload),
    # every answer comes down (header + parameters); nothing else crosses the wire
    cfg = make_config(algorithm="async", workers=2, steps=5, eval_every=5)
    r = Run(cfg)
    for _ in range(5):
        r.train_step()
    model = r.model.numel * 4
    payload = r.algorithm.averager.compressor.nbytes(r.model.numel, torch.float32)
    assert r.transport.bytes_sent == 10 * (HEADER_BYTES + payload) + 10 * (HEADER_BYTES + model)
    # the two next gradients are in flight, in the transport's mailbox (a checkpoint holds them)
    box = r.transport.mailbox
    assert sum(len(q) for (src, dst, _), q in box.items() if dst == SERVER) == 2
    again = Run(cfg)
    again.load_state_dict(through_bytes(r.state_dict()))  # a checkpoint resumes with them in flight
    assert [again.train_step()["loss"] for _ in range(3)] == [r.train_step()["loss"] for _ in range(3)]


def test_messages_round_trip_through_their_bytes():
    body = torch.arange(12, dtype=torch.float32).view(torch.uint8)
    msg = Message(GRADIENT, 3, tag=7, count=9, value=-1.25, body=body, flags=1, checkpoint=40)
    back = Message.from_wire(msg.to_wire())
    assert (back.kind, back.worker, back.tag, back.count, back.value, back.flags, back.checkpoint) == \
        (GRADIENT, 3, 7, 9, -1.25, 1, 40)
    assert torch.equal(back.body, body) and msg.nbytes == HEADER_BYTES + 48
    bare = Message.from_state(Message(PARAMS, 0).state_dict())
    assert bare.body is None and bare.nbytes == HEADER_BYTES
