"""What both server-mode DiLoCos (backup-diloco, async-diloco: algorithms/outer_replicas.py) must
do alike: give the simulator's figures on the real driver with one replica, and resume bitwise."""

import pytest
import torch

from gradwire.run.loop import run
from tests.helpers import final_checkpoint, read_jsonl, states_equal

SPECS = ["backup-diloco:backups=0,inner_steps=2", "async-diloco:inner_steps=2"]


@pytest.mark.parametrize("spec, compressor", [(s, "none") for s in SPECS] + [
    ("backup-diloco:backups=0,inner_steps=2,answer=change", "sign:scaled=true"),
    ("async-diloco:inner_steps=2,answer=change", "chunked-topk:chunk=16,k=2")])
def test_simulator_and_real_driver_agree_with_one_replica(make_config, spec, compressor):
    base = make_config(algorithm=spec, workers=1, steps=6, eval_every=3, lr=0.01, stragglers="none:compute_s=0.001",
                       compressor=compressor)
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
                                  "async-diloco:inner_steps=2,period=2",
                                  # compressed both ways: the server's copies of the replicas' θ resume too
                                  "backup-diloco:backups=1,inner_steps=2,answer=change|sign:scaled=true",
                                  "async-diloco:inner_steps=2,period=2,answer=change|randk:ratio=0.1"])
def test_resume_is_bitwise_exact(make_config, tmp_path, spec):
    """Stopped at step 7 (a checkpoint at 6, with messages in flight under the tail stragglers) and
    resumed: the same state and metrics as the run that never stopped."""
    spec, _, compressor = spec.partition("|")
    kw = dict(algorithm=spec, workers=3, steps=9, eval_every=3, lr=0.01, stragglers="tail:p=0.2,slowdown=10",
              checkpoint_every=3, compressor=compressor or "none")
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


@pytest.mark.parametrize("spec", ["backup-diloco:backups=1,inner_steps=2,answer=change",
                                  "async-diloco:inner_steps=2,answer=change"])
def test_compressed_answers_follow_ef21_p_and_cost_the_codecs_bytes(make_config, spec, monkeypatch):
    """answer=change: each answer to replica w is C(θ - w̃_w), w̃_w ← w̃_w + C(θ - w̃_w) (EF21-P,
    Gruntkowska et al. 2023), C the codec's encode then decode; a reference replays that rule on the
    θ each answer was made from, and the replica's copy equals it bitwise, as does the server's; each
    answer costs the header and the codec's payload, not θ's 32 bits a parameter."""
    from gradwire.algorithms.outer_replicas import ServerAnswers
    from gradwire.algorithms.protocol import HEADER_BYTES
    from gradwire.compress import build
    from gradwire.compress.base import Packet
    from gradwire.run.loop import Run
    from gradwire.transports.base import SERVER

    made, original = [], ServerAnswers.body

    def body(self, worker, whole=False):
        made.append((worker, whole, self.theta.clone()))
        return original(self, worker, whole)

    monkeypatch.setattr(ServerAnswers, "body", body)
    r = Run(make_config(algorithm=spec, workers=3, compressor="sign:scaled=true", stragglers="tail:p=0.3,slowdown=5"))
    received = []
    recv = r.transport.recv

    def recorded(nbytes, src, dst, **kw):
        if src == SERVER:
            received.append(nbytes)
        return recv(nbytes, src, dst, **kw)

    r.transport.recv = recorded
    for _ in range(6):
        r.train_step()
    codec = build("sign:scaled=true")
    start = Run(make_config(algorithm=spec, workers=3)).algorithm.theta  # every replica's first copy
    reference = {w: start.clone() for w in range(3)}
    for w, whole, theta in made:
        assert not whole
        change = theta - reference[w]
        reference[w] += codec.decode(Packet(codec.encode(change).buffer, change.shape, change.dtype))
    alg = r.algorithm
    answered = {w for w, _, _ in made}
    assert answered == {0, 1, 2} and len(made) >= 12
    for w in answered:  # the simulator applies an answer as it delivers it: every copy is up to date
        assert torch.equal(alg.answers.views[w], reference[w]) and torch.equal(alg.workers.held[w], reference[w])
    assert not torch.equal(reference[0], alg.theta)  # what the answers left out is still owed
    payload = codec.encode(torch.zeros_like(start)).buffer.numel()
    assert payload * 8 < start.numel() * 32 / 16 and set(received) == {HEADER_BYTES + payload}


def test_every_replica_follows_the_schedule_by_the_runs_progress(make_config, monkeypatch):
    """--lr-schedule spans --steps × H inner updates; a replica's phase computed for tag t starts at
    the run's progress then (async-diloco: t arrivals × H/n), so under a slow worker the fast ones do
    not run past the schedule (they took 125 updates of 100 and ended at rate 0) nor the slow one lag
    behind it (it ended at 58 % of --lr): every replica's last inner step is near the schedule's end."""
    from gradwire.algorithms.optim import ScheduledRate
    from gradwire.algorithms.outer_replicas import PhaseRate
    from gradwire.run.loop import Run

    used: dict[int, list[float]] = {}
    at = PhaseRate.at

    def recorded(self, update):
        used.setdefault(id(self), []).append(at(self, update))
        return used[id(self)][-1]

    monkeypatch.setattr(PhaseRate, "at", recorded)
    r = Run(make_config(algorithm="async-diloco:inner_steps=5", workers=4, steps=20, lr=0.01,
                        lr_schedule="cosine", stragglers="slow:count=1,slowdown=3"))
    for _ in range(20):
        r.train_step()
    counts = r.algorithm.workers.gradients
    assert max(counts.values()) > 100 > min(counts.values())  # the fast ones take more than 20 × 5 updates
    schedule = ScheduledRate(0.01, "cosine", 100)
    for w, opt in r.algorithm.workers.replicas.opt.items():
        rates = used[id(opt.rate)]
        assert rates[-1] <= schedule.at(100 - 2 * 5), (w, rates[-1])  # at the schedule's end, the slow one too
        assert sum(rate == schedule.at(100) for rate in rates) <= 5, w  # past it for one phase at most (after the end)


def test_a_replica_that_rejoins_continues_the_schedule_where_the_run_is(make_config):
    """A JOIN (a replica rejoining with no state of its own) carries the server's tag: the replica's
    next phase is at that round's place in --lr-schedule, not at its optimizer's count."""
    from gradwire.algorithms.optim import ScheduledRate
    from gradwire.run.loop import Run

    r = Run(make_config(algorithm="backup-diloco:backups=1,inner_steps=3", workers=3, steps=10, lr=0.01,
                        lr_schedule="cosine"))
    for _ in range(4):
        r.train_step()
    alg = r.algorithm
    opt = alg.workers.replicas.opt[0]
    opt.steps = 0  # as a replica that rejoins without state: a fresh optimizer
    opt.exp_avg.zero_(), opt.exp_avg_sq.zero_()
    alg.workers.apply(0, alg.join_reply(0))
    assert alg.workers.tag[0] == alg.current == 5
    rates = []
    at = opt.rate.at
    opt.rate.at = lambda update: rates.append(at(update)) or rates[-1]
    alg.workers.message(r.ctx, 0, 99, alg.averager)
    schedule = ScheduledRate(0.01, "cosine", 10 * 3)
    assert rates == [schedule.at(12), schedule.at(13), schedule.at(14)]  # round 5's three inner steps
    assert opt.steps == 3 and rates[0] != schedule.at(0)


def test_compressed_answers_through_an_unbiased_codec_stay_close_to_theta(make_config):
    """EF21-P needs a contractive compressor: rand-k's answers are scaled by 1/(1 + ω) as error
    feedback's input is, so the replicas' copies stay near θ and the run learns (unscaled, the copies'
    distance to θ grew about √ω a round: loss 1.3e6 after 30 steps)."""
    from gradwire.run.loop import Run

    cfg = make_config(algorithm="backup-diloco:backups=1,inner_steps=2,answer=change", workers=4, steps=30,
                      lr=0.01, compressor="randk:ratio=0.1")
    r = Run(cfg)
    first = r.train_step()["loss"]
    for _ in range(29):
        info = r.train_step()
    alg = r.algorithm
    assert info["loss"] < first
    for w, view in alg.answers.views.items():
        assert float((alg.theta - view).norm()) < float(alg.theta.norm()), w


@pytest.mark.parametrize("spec, compressor, noted", [
    ("backup-diloco:answer=change", "randk:ratio=0.1", True), ("async-diloco:answer=change", "qsgd", True),
    ("async-diloco:answer=change", "pquant:p=inf,block=32", True),
    ("backup-diloco:answer=change,outer_momentum=0", "sign:scaled=true", False),  # biased: the note below
    ("backup-diloco:answer=change", "natural", False),  # unbiased, but ω = 1/8: not scaled
    ("backup-diloco:answer=change", "none", False), ("backup-diloco", "randk:ratio=0.1", False)])
def test_compressed_answers_through_a_scaled_codec_are_noted(make_config, spec, compressor, noted):
    """answer=change through an unbiased codec of ω >= 1 runs, with a note naming the codec and the
    biased ones that keep the copies closer (its answers are scaled by 1/(1 + ω))."""
    from gradwire.run.combination import check_combination

    notes = check_combination(make_config(algorithm=spec, compressor=compressor)).notes
    assert bool(notes) == noted
    if noted:
        assert (f"through {compressor!r}, an unbiased codec: where its variance ω at the model's size is >= 1 "
                "they are scaled by 1/(1 + ω)") in notes[0]
        assert "sign:scaled=true or chunked-topk" in notes[0] and "(outer_momentum=0)" in notes[0]


@pytest.mark.parametrize("spec, compressor, factor", [
    ("backup-diloco:answer=change", "sign:scaled=true", "7"),  # outer_lr 0.7, momentum 0.9
    ("async-diloco:answer=change", "topk:ratio=0.1", "2"),  # outer_lr 0.2, momentum 0.9
    ("backup-diloco:answer=change,outer_lr=1,outer_momentum=0", "sign:scaled=true", None),
    ("backup-diloco:answer=change", "fp16", None),  # a cast
    ("backup-diloco:answer=change", "natural", None),  # unbiased, unscaled
    ("backup-diloco", "sign:scaled=true", None)])  # θ answered
def test_lossy_answers_with_outer_momentum_are_noted_with_the_step_they_lag(make_config, spec, compressor, factor):
    """answer=change through a biased lossy codec with outer momentum: a note with the factor by which
    θ outruns a round's mean change, and the measured setting without momentum."""
    from gradwire.run.combination import check_combination

    notes = check_combination(make_config(algorithm=spec, compressor=compressor)).notes
    if factor is None:
        assert not notes, notes
    else:
        assert len(notes) == 1 and f"through {compressor!r}, a lossy codec, with outer momentum 0.9" in notes[0]
        assert f"outer_lr / (1 - outer_momentum) = {factor} times a round's mean change" in notes[0]
        assert "with outer_lr=1,outer_momentum=0 0.623" in notes[0]


@pytest.mark.parametrize("spec, compressor, server_only", [
    ("backup-diloco:backups=0,inner_steps=2,answer=change", "sign:scaled=true", ("theta", "answers", "outer")),
    ("async-diloco:inner_steps=2,period=2", "none", ("theta", "answers", "outer")),
    ("async", "none", ("x", "opt")),
    ("sync:backups=1", "none", ("x", "opt")),
    ("easgd:async=true,period=2", "none", ("center",)),
    ("lsgd:async=true,period=2", "none", ("leader_x",))])
def test_only_the_server_process_holds_the_server_s_model_sized_state(make_config, monkeypatch, tmp_path, spec,
                                                                       compressor, server_only):
    """On a real backend process 0 serves and process w + 1 hosts worker w: a worker's process holds
    its replica (or parameter copy), inner optimizer and codec, and none of the server's parameters,
    answers (the copies of each replica's θ under answer=change) or optimizer, model-sized tensors it
    would never use; nor does its checkpoint. Stopped and resumed from those checkpoints, the run ends
    as one that never stopped: every process's final state equal where the real driver's result does
    not depend on the order of arrivals (a round that waits for every replica), and finished where it
    does (async; the first N of each step)."""
    from gradwire.algorithms.base import Algorithm

    built = {}
    setup = Algorithm.setup

    def recorded(self, ctx, params, optim, codec):
        setup(self, ctx, params, optim, codec)
        built[ctx.transport.rank] = self

    monkeypatch.setattr(Algorithm, "setup", recorded)
    kw = dict(algorithm=spec, compressor=compressor, workers=3, steps=6, eval_every=3, lr=0.01, backend="threads",
              timeout_s=30, checkpoint_every=3, stragglers="none:compute_s=0.001")
    assert run(make_config(out="whole", **kw), progress=False)["status"] == "finished"
    assert sorted(built) == [0, 1, 2, 3]
    for name in server_only:
        assert getattr(built[0], name) is not None, name
    for p in (1, 2, 3):
        assert [name for name in server_only if getattr(built[p], name) is not None] == [], p
    stepdir = tmp_path / "whole" / "checkpoint" / "step-00000006"
    assert set(server_only) <= set(torch.load(stepdir / "rank0.pt", weights_only=True)["state"]["algorithm"])
    for p in (1, 2, 3):
        state = torch.load(stepdir / f"rank{p}.pt", weights_only=True)["state"]["algorithm"]
        assert not set(server_only) & set(state), p
    run(make_config(out="split", **kw | dict(steps=4)), progress=False)
    resumed = run(make_config(out="split", resume=True, **kw), progress=False)
    assert resumed["resumed"] and resumed["status"] == "finished"
    if not spec.startswith("backup"):  # each arrival applied at once, or the first N taken: the threads' order
        return
    for p in range(4):
        whole = torch.load(stepdir / f"rank{p}.pt", weights_only=True)["state"]["algorithm"]
        split = torch.load(tmp_path / "split" / "checkpoint" / "step-00000006" / f"rank{p}.pt",
                           weights_only=True)["state"]["algorithm"]
        assert states_equal(whole, split), p
