"""Server mode, one protocol and two drivers: the simulator's driver and the real one (here on the
threads backend, the code path of torch.distributed's processes in one process) run each
server-mode algorithm's protocol with the same arithmetic and the same bytes."""

import collections
from pathlib import Path

import pytest
import torch

from gradwire.algorithms import ALGORITHMS
from gradwire.algorithms.base import Algorithm
from gradwire.algorithms.protocol import ACK, GRADIENT, HEADER_BYTES, HELLO, JOIN, PARAMS, SAVE, Message
from gradwire.run.loop import Run, run
from gradwire.transports.base import SERVER
from tests.helpers import AsyncServerSide, read_jsonl, through_bytes

RELEASE_BYTES = 8  # the server's release of a worker that said goodbye (servers/real.py)

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
    # the summaries' bytes are the training's, the last row's on both drivers; the real server's end
    # (the message in flight received and answered with STOP, the goodbye, the release) is apart
    assert sim["bytes_sent"] == real["bytes_sent"] == a[-1]["bytes_sent"] == b[-1]["bytes_sent"]
    assert sim["finish_bytes"] == 0 < real["finish_bytes"]
    if spec == "async":  # a gradient (uncompressed: the model's size) up, the parameters down, BYE, release
        model = Run(base).model.numel * 4
        assert real["finish_bytes"] == 2 * (HEADER_BYTES + model) + HEADER_BYTES + RELEASE_BYTES


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


@pytest.mark.parametrize("spec, survives", [("sync:backups=1", True), ("backup-diloco:backups=0,inner_steps=2", False),
                                            ("sync:backups=1,overlap=false", True)])
def test_a_loss_beyond_the_backups_fails_at_once_naming_it(make_config, monkeypatch, spec, survives):
    """Worker 1 dies at its third step (its thread ends, nothing more is sent). With a backup the run
    finishes without it; without one a step can never gather N messages: the server fails at the loss,
    naming worker 1 only (it used to wait until the live workers' own waits timed out, then blamed them)."""
    import json

    from gradwire.errors import CommunicationError
    from gradwire.servers import real

    step = real.RealWorker.step

    def dies(self, s):
        if self.w == 1 and s == 3:
            raise SystemExit("worker 1 dies")
        return step(self, s)

    monkeypatch.setattr(real.RealWorker, "step", dies)
    cfg = make_config(algorithm=spec, workers=3, steps=8, eval_every=8, backend="threads", timeout_s=3,
                      stragglers="none:compute_s=0.001")
    if survives:  # the threads backend re-raises the dead thread's error once the run is over
        with pytest.raises(SystemExit, match="worker 1 dies"):
            run(cfg)
        summary = json.loads((Path(cfg.out) / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["lost_workers"] == [1] and summary["steps"] == 8
        return
    with pytest.raises(CommunicationError, match=r"1 of 3 workers lost \(worker 1: .*needs 3 workers' messages"):
        run(cfg)
    summary = json.loads((Path(cfg.out) / "summary.json").read_text())
    assert summary["status"] == "failed" and "worker 0" not in summary["error"] and "worker 2" not in summary["error"]


@pytest.mark.parametrize("spec", ["async", "sync:backups=1", "easgd:async=true,period=2",
                                  "backup-diloco:backups=1,inner_steps=2"])
def test_a_worker_that_rejoins_goes_on_counting_from_the_cut(make_config, spec):
    """Worker 1 has no state in the checkpoint (its file removed): it rejoins with HELLO and the
    server's JOIN carries the count it last heard from it, so the worker's count (summary
    ``local_steps``) keeps equal to the computations the server took from it (it restarted at 0)."""
    cfg = make_config(algorithm=spec, workers=3, steps=6, eval_every=3, backend="threads", timeout_s=30,
                      checkpoint_every=6, stragglers="none:compute_s=0.001")
    run(cfg)
    root = Path(cfg.out) / "checkpoint"
    (root / (root / "latest").read_text().strip() / "rank2.pt").unlink()
    summary = run(cfg.replace(steps=12, resume=True, overwrite=False))
    assert summary["rejoined_workers"] == [1]
    assert summary["local_steps"] == summary["gradients_received"]  # worker 1's restarted at 0 fell short


def test_a_checkpoint_whose_every_worker_is_lost_fails_and_commits_nothing():
    """Every worker's connection fails while the server gathers a checkpoint's cut: the run fails with
    "every worker was lost" (the cut's deadline handling swallowed it, and committed an empty cut as
    ``latest``: a restart would have brought every worker back with nothing)."""
    import types

    from gradwire.errors import CommunicationError
    from gradwire.servers.driver import DriverParts
    from gradwire.servers.real import RealServer
    from gradwire.transports.base import PeerLost, Transport
    from gradwire.transports.clocks import WallClock

    class DeadPeers(Transport):
        def recv(self, nbytes, src, dst, *, tag=0, timeout_s=0.0, count=True):
            raise PeerLost(f"worker process {src} died")

        def send(self, *args, **kwargs):
            raise PeerLost("dead")

        allgather = allreduce_mean = broadcast = gather = None  # no collectives in server mode

    class Checkpoints:
        def __init__(self):
            self.calls = []

        def __getattr__(self, name):
            return lambda *args, **kwargs: self.calls.append(name)

    checkpoints = Checkpoints()
    ctx = types.SimpleNamespace(world_size=2, local_ranks=(), device=torch.device("cpu"), timeline=None)
    server = RealServer(DriverParts(ctx=ctx, algorithm=AsyncServerSide(), transport=DeadPeers(), clock=WallClock(),
                                    timeout_s=30.0, checkpoints=checkpoints))
    with pytest.raises(CommunicationError, match="every worker was lost"):
        server.save_checkpoint(10)
    assert "save" not in checkpoints.calls and "mark_latest" not in checkpoints.calls


@pytest.mark.parametrize("refused_at", [0, 1])  # the header refused, or the header sent and the body refused
def test_a_refused_answer_counts_only_the_bytes_that_did_not_go(refused_at):
    """gloo refuses a send to a worker that has gone: the worker is lost, and the summary's
    ``answers_refused_bytes`` counts what never left (the whole answer, or its body once the header
    went), so that the bytes received by the workers equal what the server says it sent less it."""
    from gradwire.servers.real import RealServer
    from gradwire.transports.base import PeerLost

    class Sent:
        def wait(self, timeout):
            pass

    class Refusing:  # accepts ``refused_at`` sends, then refuses
        def __init__(self):
            self.sends = 0

        def send(self, *args, **kwargs):
            if self.sends == refused_at:
                raise PeerLost("worker process 2 died")
            self.sends += 1
            return Sent()

    server = object.__new__(RealServer)  # the reply and its bookkeeping only: no process group
    server.n, server.algo, server.transport, server.timeout_s = 2, AsyncServerSide(), Refusing(), 1.0
    server.lost, server.lost_in_run, server.in_flight, server.orphans = {}, {}, {}, []
    server.finished, server.refused_bytes = False, 0
    answer = Message(PARAMS, 1, body=torch.zeros(100, dtype=torch.uint8))
    server._reply(answer)
    assert server.lost == {1: "worker process 2 died"} and server.algo.told == [1] and 1 not in server.in_flight
    assert server.refused_bytes == (HEADER_BYTES + 100 if refused_at == 0 else 100)


def _scripted_server(n: int, script: list):
    """A RealServer on no process group whose inbox hands over ``script`` in order: a Message, or
    ``("lose", w)`` (worker w's connection fails there); the checkpoints and the sends are recorded."""
    import time
    import types

    from gradwire.servers.real import RealServer

    class Sent:
        def wait(self, timeout):
            pass

    class Transport:
        def __init__(self):
            self.sent = []  # (worker, kind) of every message the server sent

        def send(self, tensor, src, dst, tag=0):
            if tensor.numel() == HEADER_BYTES:
                self.sent.append((dst, int(tensor.view(torch.int64)[0])))
            return Sent()

        def count(self, nbytes, seconds):
            pass

    class Inbox:
        last_arrival = time.perf_counter()

        def next_message(self, deadline, lose, done):
            while script:
                item = script.pop(0)
                if isinstance(item, Message):
                    return item
                lose(item[1], "worker process died")
                if done is not None and done():
                    return None
            return None

    class Checkpoints:
        def __init__(self):
            self.calls = []

        def __getattr__(self, name):
            return lambda *args, **kwargs: self.calls.append(name)

    server = object.__new__(RealServer)
    server.n, server.algo, server.transport, server.timeout_s = n, AsyncServerSide(), Transport(), 30.0
    server.inbox, server.clock = Inbox(), types.SimpleNamespace(now=0.0)
    server.ctx = types.SimpleNamespace(device=torch.device("cpu"))
    server.parts = types.SimpleNamespace(checkpoints=Checkpoints())
    server.lost, server.lost_in_run, server.in_flight, server.orphans = {}, {}, {}, []
    server.said_bye, server.finished, server.refused_bytes, server.rejoined = set(), False, 0, set()
    server.received, server.counts = {w: 0 for w in range(n)}, {w: 0 for w in range(n)}
    server.replay = collections.deque()
    return server


def test_a_worker_lost_before_the_cut_is_left_out_and_the_checkpoint_commits():
    """Worker 1 sends its next gradient, then dies before every live worker holds one: the cut is
    worker 0 alone (no SAVE to the dead worker), and the checkpoint commits without it."""
    server = _scripted_server(2, [Message(GRADIENT, 1, count=4), ("lose", 1), Message(GRADIENT, 0, count=4),
                                  Message(ACK, 0, count=4)])
    server.save_checkpoint(10)
    assert server.transport.sent == [(0, SAVE)]
    assert server.parts.checkpoints.calls == ["clear_parts", "save", "mark_latest"]
    assert [m.worker for m in server.replay] == [1, 0]  # held, handled next ...
    assert server._receive("step 11").worker == 0  # ... but the lost worker's, which is dropped
    assert not server.replay


def test_a_member_lost_after_its_acknowledgement_abandons_the_cut():
    """Both workers hold and get SAVE; worker 1 acknowledges, then dies before worker 0 does: the
    algorithm has already forgotten worker 1 (on_lost), so the cut is not committed (a resume would
    bring it back with its own state while the server's state counts it lost); ``latest`` stays."""
    server = _scripted_server(2, [Message(GRADIENT, 0, count=4), Message(GRADIENT, 1, count=4),
                                  Message(ACK, 1, count=4), ("lose", 1), Message(ACK, 0, count=4)])
    server.save_checkpoint(10)
    assert server.transport.sent == [(0, SAVE), (1, SAVE)]
    assert "save" not in server.parts.checkpoints.calls and "mark_latest" not in server.parts.checkpoints.calls
    assert [m.worker for m in server.replay] == [0, 1]  # what was held is handled all the same


def test_the_workers_that_rejoined_before_a_checkpoint_are_still_named_after_resuming_from_it():
    """Worker 1 rejoined (HELLO) before the cut: the resumed server's summary still names it, as it
    names the workers lost before its checkpoint."""
    before = _scripted_server(3, [])
    before.rejoined = {1}
    after = _scripted_server(3, [])
    after.load_state_dict(through_bytes({"server": before._cut_state([])}))
    after.said_bye = {0, 1, 2}
    assert after.finish()["rejoined_workers"] == [1]


def test_a_worker_lost_after_the_last_step_ends_the_run_normally():
    """Once the run's steps are done (finish), a worker that dies before its goodbye is named lost,
    and the run still ends: even where a step needed every worker (no backups), there are no
    steps left to fail."""
    from gradwire.algorithms.protocol import BYE

    server = _scripted_server(2, [("lose", 1), Message(BYE, 0, count=8)])
    server.algo.workers_needed = lambda: 2  # a step takes both workers' messages
    summary = server.finish()
    assert summary["lost_workers"] == [1] and summary["lost_reasons"] == {"1": "worker process died"}
    assert server.said_bye == {0}


def test_a_worker_that_rejoins_during_a_cut_is_answered_and_then_holds_like_the_others():
    """Worker 1 says HELLO while the server gathers a cut: it gets its JOIN at once (it holds no
    message yet), and joins the cut with the gradient it sends next."""
    server = _scripted_server(2, [Message(GRADIENT, 0, count=4), Message(HELLO, 1), Message(GRADIENT, 1, count=1),
                                  Message(ACK, 0, count=4), Message(ACK, 1, count=1)])
    server.save_checkpoint(10)
    assert server.transport.sent == [(1, JOIN), (0, SAVE), (1, SAVE)]
    assert server.rejoined == {1} and server.parts.checkpoints.calls == ["clear_parts", "save", "mark_latest"]
    assert [(m.worker, m.kind) for m in server.replay] == [(0, GRADIENT), (1, GRADIENT)]


def test_a_worker_that_never_says_goodbye_is_named_lost():
    """The run is over and worker 1 stays silent until the deadline: the summary names it lost
    ("did not finish"); worker 0's count is the one its goodbye said."""
    from gradwire.algorithms.protocol import BYE

    server = _scripted_server(2, [Message(BYE, 0, count=8)])
    summary = server.finish()
    assert summary["lost_workers"] == [1] and summary["lost_reasons"] == {"1": "did not finish"}
    assert summary["local_steps"] == {"0": 8, "1": 0}


def test_a_worker_lost_before_the_checkpoint_resumed_from_stays_named_through_the_next_one():
    """Resumed from a checkpoint that named worker 1 lost, the server took worker 1 back (HELLO), then
    saved a checkpoint of its own: resuming from that one, the summary still names worker 1 as lost
    in this run (and as rejoined)."""
    first = _scripted_server(2, [])
    first.lost_in_run = {1: "SIGKILL (signal 9)"}  # loaded from the older checkpoint; lost forgot it
    first._handle(Message(HELLO, 1))
    assert first.lost == {} and first.transport.sent == [(1, JOIN)]
    second = _scripted_server(2, [])
    second.load_state_dict(through_bytes({"server": first._cut_state([])}))
    second.said_bye = {0, 1}
    summary = second.finish()
    assert summary["lost_workers"] == [1] and summary["lost_reasons"] == {"1": "SIGKILL (signal 9)"}
    assert summary["rejoined_workers"] == [1]


def test_the_end_stops_listening_once_every_worker_said_goodbye():
    """finish() returns as soon as every worker has said goodbye (or is lost): it does not wait out
    its deadline for messages that cannot come, and leaves anything after the goodbyes unread."""
    from gradwire.algorithms.protocol import BYE

    late = Message(GRADIENT, 0, count=9)
    script = [Message(BYE, 0, count=8), ("lose", 2), Message(BYE, 1, count=8), late]
    server = _scripted_server(3, script)
    summary = server.finish()
    assert script == [late] and server.said_bye == {0, 1}
    assert summary["lost_workers"] == [2] and summary["gradients_received"] == {"0": 0, "1": 0, "2": 0}
