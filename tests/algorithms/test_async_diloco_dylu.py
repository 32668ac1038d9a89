"""Asynchronous DiLoCo with dynamic local updates (``dylu=true``, Liu et al. 2024): each replica's
number of inner steps follows its measured speed. Replayed against a reference written from the
paper's rule (H_i = floor(H v_i / max_j v_j), at least 1) on the speeds the messages reported, the
reported seconds against the straggler model's draws of the steps taken, θ against the delayed
Nesterov reference; the balancing it exists for; exact bytes; resume; the real drivers."""

import math
from pathlib import Path

import pytest
import torch

from gradwire.algorithms.outer_replicas import split_report
from gradwire.algorithms.protocol import GRADIENT
from gradwire.errors import ConfigError
from gradwire.run.loop import Run, run
from tests.algorithms.test_async_diloco import delayed_nesterov_reference
from tests.algorithms.test_server_diloco import assert_simulator_equals_threads
from tests.helpers import final_checkpoint, read_jsonl, states_equal


def dylu_reference(reports, *, inner_steps: int, workers: int) -> list[int]:
    """The H_i each arrival's answer gives its worker, from the (worker, inner steps, seconds) of
    every arrival so far: v_j = steps_j / seconds_j over the workers heard from, the fastest takes H."""
    steps, seconds, out = [0] * workers, [0.0] * workers, []
    for w, h, s in reports:
        steps[w] += h
        seconds[w] += s
        fastest = max(steps[j] / seconds[j] for j in range(workers) if steps[j])
        out.append(max(1, math.floor(inner_steps * (steps[w] / seconds[w]) / fastest + 1e-9)))
    return out


@pytest.mark.parametrize("stragglers", ["lognormal:sigma=0.6,compute_s=0.01",
                                        "slow:count=2,slowdown=2.5,compute_s=0.01"])
def test_every_phase_follows_the_dylu_rule(make_config, stragglers):
    """4 replicas: at each arrival the replica took exactly the H_i the reference gave it at its
    previous arrival (H before), reported the straggler model's draws of those steps, and θ follows
    the delayed Nesterov reference on the payloads in arrival order."""
    h = 6
    cfg = make_config(algorithm=f"async-diloco:inner_steps={h},outer_lr=0.5,outer_momentum=0.9,outer_warmup=0,"
                                "dylu=true",
                      dtype="float64", lr=0.01, workers=4, stragglers=stragglers)
    r = Run(cfg)
    alg, ctx = r.algorithm, r.ctx
    start, deltas, reports = alg.theta.clone(), [], []
    taken = {w: 0 for w in range(4)}      # inner steps each replica had taken at its last arrival
    assigned = {w: h for w in range(4)}   # the reference's H_i for each replica's current phase
    on_message = alg.on_message

    def replayed(msg, finished):
        if msg.kind == GRADIENT and not finished:
            w = msg.worker
            steps = alg.workers.gradients[w] - taken[w]
            payload, seconds = split_report(msg.body)
            assert steps == assigned[w]
            assert seconds == sum(ctx.compute_time(w, taken[w] + j) for j in range(1, steps + 1))
            taken[w] += steps
            reports.append((w, steps, seconds))
            assigned[w] = dylu_reference(reports, inner_steps=h, workers=4)[-1]
        answer = on_message(msg, finished)
        if msg.kind == GRADIENT and not finished:
            assert answer.replies[0].value == assigned[w]
            deltas.append(payload.view(torch.float64).view(alg.theta.shape).clone())
            expected = delayed_nesterov_reference(start, deltas, lr=0.5, momentum=0.9, period=4)
            torch.testing.assert_close(alg.theta, expected, rtol=0, atol=1e-12)
        return answer

    alg.on_message = replayed
    infos = [r.train_step() for _ in range(8)]
    assert len(reports) == 32
    assert sum(i["gradients"] for i in infos) == sum(h for _, h, _ in reports)
    phases = {h for _, h, _ in reports}
    if stragglers.startswith("slow"):  # the two slow replicas take floor(6 / 2.5) = 2 after their first phase
        assert phases == {6, 2} and min(i["inner_steps_min"] for i in infos) == 2
    else:  # the log-normal draws give the replicas different measured speeds, changing as they add up
        assert len(phases) > 2


def arrivals(make_config, dylu: bool) -> tuple[dict, list[dict]]:
    """Each replica's share of the arrivals of steps 5-10 (after its first phases), and every step's figures."""
    r = Run(make_config(algorithm=f"async-diloco:inner_steps=6,dylu={str(dylu).lower()}", lr=0.01, workers=3,
                        stragglers="slow:count=1,slowdown=3,compute_s=0.01", network="ps:mbps=1000,latency_ms=0.1"))
    senders = []
    on_message = r.algorithm.on_message

    def counted(msg, finished):
        if msg.kind == GRADIENT and not finished:
            senders.append(msg.worker)
        return on_message(msg, finished)

    r.algorithm.on_message = counted
    steps = [r.train_step() for _ in range(10)]
    return {w: senders[12:].count(w) for w in range(3)}, steps


def test_dylu_balances_a_persistently_slow_replica(make_config):
    """One replica 3x slower: without DyLU it sends a third as often as the others and its Δ are
    the stalest; with DyLU it takes H/3 = 2 inner steps once it has reported (its first phase is H),
    all three then send at the same pace, and the staleness is the n - 1 of equal replicas."""
    plain, plain_steps = arrivals(make_config, False)
    dylu, dylu_steps = arrivals(make_config, True)
    assert plain[0] * 2 < plain[1] == plain[2]
    assert max(dylu.values()) - min(dylu.values()) <= 1
    assert max(s["staleness_max"] for s in dylu_steps[2:]) == 2 < max(s["staleness_max"] for s in plain_steps[2:])
    assert all(s["inner_steps_min"] == 2 for s in dylu_steps[2:])
    assert all(s["gradients"] == 18 for s in plain_steps)


def test_the_reported_seconds_are_eight_bytes_a_message(make_config):
    """DyLU's report is the only byte it adds: 8 per pseudo-gradient (one replica: each step is one
    arrival, so 6 by step 6)."""
    base = make_config(workers=1, steps=6, eval_every=6, lr=0.01, stragglers="none:compute_s=0.001")
    plain = run(base.replace(algorithm="async-diloco:inner_steps=2", out=base.out + "-plain"), progress=False)
    dylu = run(base.replace(algorithm="async-diloco:inner_steps=2,dylu=true", out=base.out + "-dylu"), progress=False)
    a, b = read_jsonl(base.out + "-plain/metrics.jsonl"), read_jsonl(base.out + "-dylu/metrics.jsonl")
    assert plain["status"] == dylu["status"] == "finished"
    assert b[-1]["bytes_sent"] - a[-1]["bytes_sent"] == 8 * 6
    assert [x["train_loss"] for x in a] == [x["train_loss"] for x in b]  # one replica: H_1 = H throughout


def test_resume_is_bitwise_exact(make_config, tmp_path):
    """Stopped at step 7 (a checkpoint at 6, messages in flight, speeds measured under log-normal
    draws) and resumed: the same state, H_i included, and metrics as the run that never stopped."""
    kw = dict(algorithm="async-diloco:inner_steps=4,dylu=true", workers=3, steps=9, eval_every=3, lr=0.01,
              stragglers="lognormal:sigma=0.6", checkpoint_every=3)
    run(make_config(out="whole", **kw), progress=False)
    run(make_config(out="split", **kw | dict(steps=7)), progress=False)
    summary = run(make_config(out="split", resume=True, **kw), progress=False)
    assert summary["resumed"]
    whole = final_checkpoint(tmp_path / "whole")["state"]
    assert states_equal(whole, final_checkpoint(tmp_path / "split")["state"])

    def metrics(folder):
        return [{k: v for k, v in m.items() if not k.endswith("time_s")} for m in read_jsonl(folder / "metrics.jsonl")]

    assert metrics(tmp_path / "whole") == metrics(tmp_path / "split")
    assert len({s["gradients"] for s in read_jsonl(tmp_path / "whole" / "steps.jsonl")}) > 1  # H_i did change


def test_simulator_and_real_driver_agree_with_one_replica(make_config):
    base = make_config(algorithm="async-diloco:inner_steps=2,dylu=true", workers=1, steps=6, eval_every=3, lr=0.01,
                       stragglers="none:compute_s=0.001")
    assert_simulator_equals_threads(base)


def test_real_driver_gives_a_slow_replica_fewer_steps(make_config):
    """Threads backend, one replica 3x slower (the straggler model's delays slept for real, long
    beside the model's own compute): once it has reported, its phases are H/3 = 2 inner steps. Read
    from the server's measured speeds at the end, not from the last step's arrivals (a step is any 3
    arrivals, which under load may all come from the two fast replicas)."""
    cfg = make_config(algorithm="async-diloco:inner_steps=6,dylu=true", workers=3, steps=8, eval_every=8, lr=0.01,
                      backend="threads", timeout_s=30, stragglers="slow:count=1,slowdown=3,compute_s=0.02",
                      checkpoint_every=8)
    summary = run(cfg, progress=False)
    assert summary["status"] == "finished" and summary["lost_workers"] == []
    steps = read_jsonl(cfg.out + "/steps.jsonl")
    assert min(s["inner_steps_min"] for s in steps) == 2
    server = torch.load(next(Path(cfg.out, "checkpoint").glob("step-*/rank0.pt")), weights_only=True)
    speeds = server["state"]["algorithm"]["speeds"]
    per_step = [float(t) / n for t, n in zip(speeds["seconds"], speeds["steps"])]
    slow = per_step.index(max(per_step))
    assert speeds["assigned"][slow] == 2
    assert all(h > 2 for w, h in enumerate(speeds["assigned"]) if w != slow)


def test_bad_setting_is_refused_with_its_value(make_config):
    with pytest.raises(ConfigError, match="dylu"):
        Run(make_config(algorithm="async-diloco:dylu=sometimes"))


@pytest.mark.parametrize("compressor", ["fp16", "qsgd:levels=8,bucket=64", "pquant:p=inf,block=32"])
def test_a_payload_of_any_length_carries_its_seconds(make_config, compressor):
    """The seconds ride after the codec's payload, whose length need not be a multiple of 8 (fp16 of an
    odd count, a quantiser's stream): the server reads them back exactly, as the replicas measured them."""
    r = Run(make_config(algorithm="async-diloco:inner_steps=2,dylu=true", lr=0.01, workers=3, compressor=compressor,
                        stragglers="lognormal:sigma=0.5,compute_s=0.01"))
    reported, on_message = [], r.algorithm.on_message

    def read(msg, finished):
        if msg.kind == GRADIENT and not finished:
            reported.append((msg.worker, split_report(msg.body)[1], len(msg.body) % 8))
        return on_message(msg, finished)

    r.algorithm.on_message = read
    for _ in range(3):
        r.train_step()
    assert reported and any(tail for _, _, tail in reported)  # some payload was not a multiple of 8 bytes
    assert r.algorithm.speeds.seconds.sum() == pytest.approx(sum(s for _, s, _ in reported), rel=1e-12)
