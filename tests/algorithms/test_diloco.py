"""DiLoCo (Douillard et al. 2023) and Streaming DiLoCo (Douillard et al. 2025) on the simulator:
the reductions to synchronous SGD and to each other, the outer loop against a reference written from
the papers with torch.optim.SGD (Nesterov), the fragments' schedule, compressed outer
gradients, and checkpoints that resume bitwise."""

import math
from pathlib import Path

import pytest
import torch

from gradwire.algorithms.optim import AdamW
from gradwire.errors import ConfigError
from gradwire.run.loop import Run
from tests.algorithms.test_local_updates_checkpoint import only_tensors_and_ints
from tests.helpers import through_bytes

DILOCO_AS_SYNC = "diloco:inner_steps=1,outer_lr=1,outer_momentum=0,inner=sgd"


def trajectory(cfg, steps: int = 12) -> list[torch.Tensor]:
    r = Run(cfg)
    out = []
    for _ in range(steps):
        r.train_step()
        out.append(r.algorithm.eval_params().clone())
    return out


@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-13), ("float32", 1e-6)])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_diloco_with_one_sgd_step_and_outer_lr_1_is_synchronous_sgd(make_config, dtype, tolerance, momentum):
    """H = 1, plain SGD inside (momentum too: it stays local but averaging is linear), outer SGD at
    lr 1: θ - mean_i (θ - (θ - γ g_i)) is θ - γ mean_i g_i in exact arithmetic. In floating point
    the outer gradient θ - x_i rounds differently from γ g_i, so the trajectories agree to a few
    units in the last place of the parameters, not bitwise: compared with an absolute tolerance
    near the dtype's resolution at the parameters' scale (|x| < 1 here)."""
    cfg = make_config(dtype=dtype, momentum=momentum)
    sync = trajectory(cfg.replace(algorithm="sync"))
    diloco = trajectory(cfg.replace(algorithm=DILOCO_AS_SYNC))
    for step, (a, b) in enumerate(zip(sync, diloco, strict=True), 1):
        torch.testing.assert_close(b, a, rtol=0, atol=tolerance, msg=lambda m, s=step: f"step {s}: {m}")
    assert not torch.equal(sync[-1], trajectory(cfg.replace(algorithm="diloco:inner_steps=2,outer_lr=1,"
                                                                      "outer_momentum=0,inner=sgd"))[-1])


UNIT_ROUNDOFF = 2.0**-53  # float64


@pytest.mark.parametrize("inner_steps", [1, 4])
def test_one_worker_diloco_with_a_plain_outer_step_is_adamw(make_config, inner_steps):
    """One worker, outer lr 1, no momentum: θ <- θ - (θ - x) = x, so DiLoCo is plain AdamW over the
    same batches (Douillard et al. 2023, Alg. 1 with n = 1, η = 1, μ = 0), compared with sync's AdamW
    (itself equal to torch.optim.AdamW, below) at every round end, in float64. Not bitwise: fl(θ - x)
    = (θ - x)(1 + δ) and θ - fl(θ - x) rounds again, so a round moves θ off x by at most
    u (|θ - x| + |x|) ≤ 3 u max|x| (u = 2^-53); the tolerance allows that at every round, twice over,
    with no growth through the next inner steps (measured: 3e-17 after 24 rounds, |x| < 0.36)."""
    cfg = make_config(workers=1, steps=24, dtype="float64", lr=0.01)
    adamw = trajectory(cfg.replace(algorithm="sync", optimizer="adamw:beta1=0.9,beta2=0.95,eps=1e-8",
                                   weight_decay=0.1), 24)
    plain = f"diloco:inner_steps={inner_steps},outer_lr=1,outer_momentum=0,weight_decay=0.1"
    diloco = trajectory(cfg.replace(algorithm=plain), 24)
    rounds = 24 // inner_steps
    tolerance = rounds * 2 * 3 * UNIT_ROUNDOFF * float(adamw[-1].abs().max())
    for step in range(inner_steps, 25, inner_steps):
        torch.testing.assert_close(diloco[step - 1], adamw[step - 1], rtol=0, atol=tolerance,
                                   msg=lambda m, s=step: f"step {s}: {m}")
    damped = trajectory(cfg.replace(algorithm=plain.replace("outer_lr=1", "outer_lr=0.9")), 24)
    assert float((damped[-1] - adamw[-1]).abs().max()) > 1e6 * tolerance  # the comparison can fail


def test_one_worker_diloco_with_sgd_inside_at_h_3_is_momentum_sgd(make_config):
    """The same identity with local SGD's heavy ball inside (momentum 0.9, kept across rounds) at
    H = 3: one worker's DiLoCo is sync SGD with momentum, to the same rounding bound."""
    cfg = make_config(workers=1, steps=24, dtype="float64", lr=0.1, momentum=0.9)
    sgd = trajectory(cfg.replace(algorithm="sync"), 24)
    diloco = trajectory(cfg.replace(algorithm="diloco:inner_steps=3,outer_lr=1,outer_momentum=0,inner=sgd"), 24)
    tolerance = 8 * 2 * 3 * UNIT_ROUNDOFF * float(sgd[-1].abs().max())
    for step in range(3, 25, 3):
        torch.testing.assert_close(diloco[step - 1], sgd[step - 1], rtol=0, atol=tolerance,
                                   msg=lambda m, s=step: f"step {s}: {m}")
    assert not torch.allclose(diloco[1], sgd[1], rtol=0, atol=tolerance)  # mid-round θ is the last round's


def test_outer_warmup_ramps_the_momentum(make_config):
    alg = Run(make_config(algorithm="diloco:inner_steps=2,outer_momentum=0.8,outer_warmup=4", lr=0.01)).algorithm
    assert [alg.outer_momentum_at(k) for k in range(6)] == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 0.8])
    constant = Run(make_config(algorithm="diloco:inner_steps=2,outer_momentum=0.8,outer_warmup=0", lr=0.01))
    assert [constant.algorithm.outer_momentum_at(k) for k in range(3)] == [0.8, 0.8, 0.8]


@pytest.mark.parametrize("spec, evaluated", [
    ("diloco:inner_steps=3", [0, 6, 9, 12]),  # round ends 3, 6, 9, 12: the first at or after 4, 8, 12
    ("diloco:inner_steps=5", [0, 5, 10, 12]),  # and always the last step
    ("streaming-diloco:inner_steps=4,fragments=2,overlap=1", [0, 4, 8, 12]),  # merges every H/P steps: plain
    ("sync", [0, 4, 8, 12]),
])
def test_evaluations_fall_on_round_ends(make_config, spec, evaluated):
    """θ changes only when a round ends: DiLoCo evaluates at the first round end at or after every
    multiple of --eval-every (mid-round it would credit steps θ has not seen), and at the last step."""
    from gradwire.run.loop import run
    from tests.helpers import read_jsonl

    cfg = make_config(algorithm=spec, lr=0.01, steps=12, eval_every=4)
    run(cfg, progress=False)
    assert [m["step"] for m in read_jsonl(Path(cfg.out) / "metrics.jsonl")] == evaluated


@pytest.mark.parametrize("inner, extra", [
    ("inner=adamw", dict(lr=0.01)),
    ("inner=sgd", dict(momentum=0.9)),
    ("inner=adamw", dict(lr=0.01, compressor="qsgd:levels=8,bucket=64", error_feedback=True)),
])
def test_streaming_diloco_with_one_fragment_and_no_overlap_is_diloco(make_config, inner, extra):
    """One fragment, τ = 0 and α = 0 (the merge replaces the local parameters): bitwise DiLoCo,
    compressed outer gradients and error feedback included."""
    cfg = make_config(**extra)
    diloco = Run(cfg.replace(algorithm=f"diloco:inner_steps=3,{inner}"))
    streaming = Run(cfg.replace(algorithm=f"streaming-diloco:inner_steps=3,fragments=1,overlap=0,alpha=0,{inner}"))
    for _ in range(12):
        assert diloco.train_step() == streaming.train_step()
        assert torch.equal(diloco.algorithm.theta, streaming.algorithm.theta)
    assert diloco.clock.now == streaming.clock.now and diloco.transport.bytes_sent == streaming.transport.bytes_sent


COSINE = "cosine:warmup=3,min_ratio=0.1"  # over the 12-step horizon; the reference runs 24 steps, past it


def cosine_factor(update: int, horizon: int = 12, warmup: int = 3, floor: float = 0.1) -> float:
    """COSINE's factor of update ``update`` (0-based), written from its definition: linear warm-up
    (update k < W at (k+1)/W), then floor + (1 - floor)(1 + cos(π p))/2, p = (k - W)/(T - W) capped at 1."""
    if update < warmup:
        return (update + 1) / warmup
    progress = min(1.0, (update - warmup) / (horizon - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


# The documented defaults (diloco.py: DILOCO_PARAMS, STREAMING_PARAMS, OUTER_LR, OUTER_MOMENTUM, OUTER_WARMUP) of
# the keys a reference reads, written here: a reference takes its numbers from the spec it ran, never from the
# algorithm object, so that a spec key the algorithm ignores or misreads is seen.
SPEC_DEFAULTS = {
    "diloco": dict(inner_steps=10, outer_lr=0.7, outer_momentum=0.9, outer_warmup=10, fragments=1, overlap=0,
                   alpha=0.0, outer_schedule="constant", inner="adamw", eager="false", merge="mix"),
    "streaming-diloco": dict(inner_steps=20, outer_lr=0.7, outer_momentum=0.9, outer_warmup=10, fragments=4,
                             overlap=1, alpha=0.0, outer_schedule="constant", inner="adamw", eager="false",
                             merge="mix"),
}
INTEGER_KEYS = ("inner_steps", "outer_warmup", "fragments", "overlap")
WORD_KEYS = ("outer_schedule", "inner", "eager", "merge")


def spec_values(spec: str) -> dict:
    """The values a DiLoCo-family spec string asks for: its own keys over SPEC_DEFAULTS, parsed here."""
    name, _, keys = spec.partition(":")
    values = dict(SPEC_DEFAULTS[name])
    for item in filter(None, keys.split(",")):
        key, value = item.split("=")
        assert key in values, f"spec key {key} has no parse in this test"
        values[key] = value if key in WORD_KEYS else int(value) if key in INTEGER_KEYS else float(value)
    return values


def test_spec_values_parses_the_spec_and_fills_the_documented_defaults():
    assert spec_values("streaming-diloco:inner_steps=4,fragments=3,overlap=2,alpha=0.3,inner=adamw") == dict(
        inner_steps=4, outer_lr=0.7, outer_momentum=0.9, outer_warmup=10, fragments=3, overlap=2, alpha=0.3,
        outer_schedule="constant", inner="adamw", eager="false", merge="mix")
    plain = spec_values("diloco:inner_steps=2,inner=sgd,outer_lr=0.5,outer_momentum=0.6,outer_warmup=0")
    assert (plain["outer_lr"], plain["outer_momentum"], plain["outer_warmup"], plain["fragments"], plain["overlap"],
            plain["alpha"], plain["inner"]) == (0.5, 0.6, 0, 1, 0, 0.0, "sgd")


@pytest.mark.parametrize("spec", [
    "diloco:inner_steps=3,inner=adamw",  # the outer Nesterov step, momentum 0.9, lr 0.7
    f"diloco:inner_steps=3,inner=adamw,outer_schedule=inner|{COSINE}",  # η f(t-1): warm-up, cosine, floor
    f"diloco:inner_steps=2,inner=sgd,outer_lr=0.5,outer_momentum=0.6,outer_warmup=2,outer_schedule=inner|{COSINE}",
    f"streaming-diloco:inner_steps=4,fragments=2,overlap=1,alpha=0.5,outer_schedule=inner|{COSINE}",
    "diloco:inner_steps=2,inner=sgd,outer_lr=0.5,outer_momentum=0.6",
    "streaming-diloco:inner_steps=4,fragments=2,overlap=1,alpha=0.5,inner=sgd",
    "streaming-diloco:inner_steps=4,fragments=3,overlap=2,alpha=0.3,inner=adamw",  # α not 1/2: the merge's sides
    "streaming-diloco:inner_steps=3,fragments=3,overlap=0,alpha=0.8,inner=adamw",
    "diloco:inner_steps=2,inner=sgd,outer_lr=0.7,outer_momentum=0.9,outer_warmup=3",  # μ 0, 0.3, 0.6, 0.9, ...
    "streaming-diloco:inner_steps=4,fragments=2,overlap=1,alpha=0.5,outer_warmup=2",
    # merge=carry: the progress made while a round travelled kept on top of θ_p (DaSGD's rule), τ < H and τ = H
    "streaming-diloco:inner_steps=4,fragments=2,overlap=2,merge=carry,inner=sgd",
    "streaming-diloco:inner_steps=3,fragments=3,overlap=3,merge=carry,outer_lr=1,outer_momentum=0",
])
def test_outer_steps_and_merges_match_a_reference(make_config, spec):
    """The outer loop against one written from the papers with torch's own optimizer, step by step:
    fragment p (offset p H / P) sends Δ = mean_i (θ_p - x_{i,p}) after every H-th inner step, its
    average arrives τ steps later, θ_p takes a step of torch.optim.SGD with Nesterov momentum
    (Douillard et al. 2023: the outer optimizer) on Δ, and every replica merges x_{i,p} <- α x_{i,p}
    + (1 - α) θ_p (Douillard et al. 2025), or with ``merge=carry`` x_{i,p} <- θ_p + (x_{i,p} - the
    x_{i,p} it sent from) (DaSGD, Zhou et al. 2020). The inner steps are gradwire's own (tested against
    torch.optim.AdamW above): the reference takes the replicas after each inner step as given. With
    ``outer_schedule=inner`` (after ``|``: the run's --lr-schedule) the round sent after step t steps at
    outer rate η f(t - 1), f the schedule's factor of that round's last inner update."""
    spec, _, schedule = spec.partition("|")
    r = Run(make_config(algorithm=spec, dtype="float64", lr=0.01, workers=3, lr_schedule=schedule or "constant"))
    alg = r.algorithm
    v = spec_values(spec)  # the numbers the spec asked for, not the algorithm's reading of them
    h, fragments, tau, alpha = v["inner_steps"], v["fragments"], v["overlap"], v["alpha"]
    eta, mu, warmup = v["outer_lr"], v["outer_momentum"], v["outer_warmup"]
    bounds = [p * alg.theta.numel() // fragments for p in range(fragments + 1)]
    ranges = list(zip(bounds, bounds[1:]))
    theta = [torch.nn.Parameter(alg.theta[a:b].clone()) for a, b in ranges]
    outer = [torch.optim.SGD([t], lr=eta, momentum=mu, nesterov=mu > 0) for t in theta]
    after_inner = {}
    inner_step = alg.replicas.sgd_step

    def recorded(ctx, rank):
        loss = inner_step(ctx, rank)
        after_inner[rank] = alg.replicas.x[rank].clone()
        return loss

    alg.replicas.sgd_step = recorded
    sent: dict[int, tuple] = {}  # fragment -> (Δ, the step it was sent at, each replica's x_p then)
    rounds = [0] * fragments

    def merge(p, x):
        a, b = ranges[p]
        delta, sent_at, sent_from = sent.pop(p)
        theta[p].grad = delta.clone()
        if v["outer_schedule"] == "inner":
            outer[p].param_groups[0]["lr"] = eta * cosine_factor(sent_at - 1)
        if warmup:  # the ramp: round k's momentum is μ min(1, k / W)
            outer[p].param_groups[0]["momentum"] = mu * min(1.0, rounds[p] / warmup)
        rounds[p] += 1
        outer[p].step()
        if not outer[p].param_groups[0]["momentum"]:  # torch keeps no buffer at μ = 0: v_k = μ_k v_{k-1} + Δ_k
            outer[p].state[theta[p]]["momentum_buffer"] = theta[p].grad.clone()
        for k in x:
            if v["merge"] == "carry":
                x[k][a:b] = theta[p].detach() + (x[k][a:b] - sent_from[k])
            else:
                x[k][a:b] = alpha * x[k][a:b] + (1 - alpha) * theta[p].detach()

    merges = 0
    for step in range(1, 25):
        r.train_step()
        x = dict(after_inner)
        for p in sorted(sent):
            if sent[p][1] + tau == step:
                merge(p, x)
                merges += 1
        for p, (a, b) in enumerate(ranges):
            if (step - p * h // fragments) % h == 0:
                sent[p] = (sum(theta[p].detach() - x[k][a:b] for k in x) / len(x), step,
                           {k: x[k][a:b].clone() for k in x})
                if tau == 0:
                    merge(p, x)
                    merges += 1
        for p, (a, b) in enumerate(ranges):
            torch.testing.assert_close(alg.theta[a:b], theta[p].detach(), rtol=0, atol=1e-12,
                                       msg=lambda m, s=step, f=p: f"θ of fragment {f} after step {s}: {m}")
        for k in x:
            torch.testing.assert_close(alg.replicas.x[k], x[k], rtol=0, atol=1e-12,
                                       msg=lambda m, s=step, w=k: f"replica {w} after step {s}: {m}")
    assert merges >= 6 and all(o.state_dict()["state"] for o in outer)  # every fragment stepped


def test_fragments_are_staggered_and_merged_tau_steps_later(make_config):
    r = Run(make_config(algorithm="streaming-diloco:inner_steps=4,fragments=2,overlap=1", lr=0.01))
    infos = [r.train_step() for _ in range(9)]
    # fragment 1 (offset 2) starts at steps 2, 6; fragment 0 (offset 0) at 4, 8; each merged one step later
    assert [i.get("merged", []) for i in infos] == [[], [], [1], [], [0], [], [1], [], [0]]
    assert [i["in_flight"] for i in infos] == [0, 1, 0, 1, 0, 1, 0, 1, 0]
    (a0, b0), (a1, b1) = r.algorithm.ranges
    assert a0 == 0 and b0 == a1 and b1 == r.model.numel and abs((b0 - a0) - (b1 - a1)) <= 1


def test_overlap_hides_communication_behind_the_next_steps(make_config):
    """On the simulator a fragment's collective runs while the workers take the next τ steps: with τ
    long enough the run takes only the compute time; with τ = 0 it also waits for every round."""
    slow = dict(network="ring:mbps=10,latency_ms=1", stragglers="none:compute_s=0.05", lr=0.01)
    hidden = Run(make_config(algorithm="streaming-diloco:inner_steps=4,fragments=2,overlap=3", **slow))
    blocking = Run(make_config(algorithm="streaming-diloco:inner_steps=4,fragments=2,overlap=0", **slow))
    for _ in range(12):
        hidden.train_step()
        blocking.train_step()
    assert hidden.transport.bytes_sent == blocking.transport.bytes_sent > 0
    assert hidden.clock.now == pytest.approx(12 * 0.05, rel=1e-9)
    assert blocking.clock.now == pytest.approx(12 * 0.05 + blocking.transport.comm_time_s, rel=1e-9)


SPECS = [
    ("diloco:inner_steps=3", {}),
    ("diloco:inner_steps=3,inner=sgd", dict(momentum=0.9)),
    ("diloco:inner_steps=2", dict(compressor="qsgd:levels=8,bucket=64", error_feedback=True)),
    ("streaming-diloco:inner_steps=4,fragments=2,overlap=2", {}),       # a fragment in flight at step 5
    ("streaming-diloco:inner_steps=3,fragments=3,overlap=3,alpha=0.5", dict(compressor="qsgd:levels=8,bucket=64",
                                                                    error_feedback=True)),
    ("streaming-diloco:inner_steps=4,fragments=2,overlap=1", dict(compressor="fp16")),
    # a cast's round in flight at step 5 on a slow link: the collective inside the averager's handle
    # restarts too, and the resumed round waits for it until the straight run's finish time
    ("streaming-diloco:inner_steps=4,fragments=2,overlap=2", dict(compressor="fp16",
                                                                 network="ring:mbps=0.05,latency_ms=5")),
    ("streaming-diloco:inner_steps=4,fragments=2,overlap=2,merge=carry", {}),  # the sent-from copies resume
    # the outer rate of a round in flight across the resume comes from its start step
    ("streaming-diloco:inner_steps=4,fragments=2,overlap=2,outer_schedule=inner", dict(lr_schedule=COSINE)),
]


@pytest.mark.parametrize("spec, extra", SPECS)
def test_resume_mid_run_equals_never_stopping(make_config, spec, extra):
    resume_mid_run(make_config, spec, dict(extra))


def resume_mid_run(make_config, spec, extra) -> bool:
    """Five steps, a checkpoint, seven more, against twelve straight; whether a round was in flight."""
    cfg = make_config(algorithm=spec, lr=extra.pop("lr", 0.01), stragglers="lognormal:sigma=0.5,compute_s=0.05",
                      **extra)
    straight = Run(cfg)
    expected = [straight.train_step() for _ in range(12)]
    first = Run(cfg)
    for _ in range(5):
        first.train_step()
    state = first.state_dict()
    only_tensors_and_ints(first.algorithm.state_dict(), spec)
    in_flight = bool(first.algorithm.in_flight)
    resumed = Run(cfg)
    resumed.load_state_dict(through_bytes(state))
    assert [resumed.train_step() for _ in range(7)] == expected[5:]
    assert [first.train_step() for _ in range(7)] == expected[5:]  # saving changed nothing
    for r in (resumed, first):
        assert torch.equal(r.algorithm.theta, straight.algorithm.theta)
        assert all(torch.equal(r.algorithm.replicas.x[k], x) for k, x in straight.algorithm.replicas.x.items())
    assert first.clock.now == straight.clock.now and first.transport.bytes_sent == straight.transport.bytes_sent
    # a round in flight at the checkpoint starts again after the resume (the same payloads), counted
    # once, finishing when it first would have: the ledger, its time and the clock as if never stopped
    assert resumed.transport.bytes_sent == straight.transport.bytes_sent
    assert resumed.transport.comm_time_s == straight.transport.comm_time_s
    assert resumed.clock.now == straight.clock.now
    return in_flight


def test_some_resume_case_has_a_round_in_flight_at_the_checkpoint(make_config):
    """The cases above include rounds in flight at the checkpoint (what ``restart`` is for)."""
    cases = [(spec, dict(extra)) for spec, extra in SPECS if "overlap=" in spec]
    assert cases and any(resume_mid_run(make_config, spec, extra) for spec, extra in cases)


def test_adamw_matches_torch_optim_adamw(device):
    """The flat AdamW is torch.optim.AdamW's update (decoupled weight decay, bias correction)."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(37, generator=g, device=device, dtype=torch.float64)
    reference = torch.nn.Parameter(x.clone())
    opt = torch.optim.AdamW([reference], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours = AdamW(x, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(5):
        grad = torch.randn(37, generator=g, device=device, dtype=torch.float64)
        reference.grad = grad.clone()
        opt.step()
        ours.apply(grad)
    torch.testing.assert_close(x, reference.detach(), rtol=1e-12, atol=1e-14)
    state = ours.state_dict()
    assert state["steps"] == 5 and state["exp_avg"].device == x.device


@pytest.mark.parametrize("merge", ["mix", "carry"])
def test_diloco_runs_on_the_device(make_config, device, merge):
    """Every tensor the algorithm makes lives on the run's device (byte payloads, and with
    merge=carry the parameters each worker sent from, included), and a resume there goes on as the
    run would have."""
    r = Run(make_config(algorithm=f"streaming-diloco:inner_steps=2,fragments=2,overlap=1,merge={merge}", lr=0.01,
                        compressor="qsgd:levels=8,bucket=64", error_feedback=True, device=device.type))
    for _ in range(5):
        r.train_step()
    assert r.algorithm.theta.device.type == device.type
    assert r.algorithm.in_flight  # a round in flight at the checkpoint below
    for entry in r.algorithm.in_flight.values():
        assert all(t.device.type == device.type for t in entry["payloads"].values())
        assert all(t.device.type == device.type for t in entry.get("sent", {}).values())
        assert ("sent" in entry) == (merge == "carry")
    resumed = Run(r.cfg)
    resumed.load_state_dict(through_bytes(r.state_dict()))
    for entry in resumed.algorithm.in_flight.values():
        assert all(t.device.type == device.type for t in entry["payloads"].values())
        assert all(t.device.type == device.type for t in entry.get("sent", {}).values())
    resumed.train_step()
    r.train_step()
    assert all(torch.equal(resumed.algorithm.replicas.x[k], x) for k, x in r.algorithm.replicas.x.items())


def test_outer_schedule_follows_the_inner_rate_and_is_inert_under_a_constant_schedule(make_config):
    """outer_schedule=inner: the outer rate of the round sent after step t is η f(t - 1) (COSINE's warm-up
    and decay, then its floor past the horizon); under the constant schedule the outer steps are those
    of outer_schedule=constant, bit for bit."""
    alg = Run(make_config(algorithm="diloco:inner_steps=2,outer_schedule=inner", lr=0.01, lr_schedule=COSINE)).algorithm
    assert [alg.outer_lr_at(t) for t in (1, 2, 3, 12, 20)] == pytest.approx(
        [0.7 / 3, 0.7 * 2 / 3, 0.7, 0.7 * 0.1 + 0.7 * 0.9 * 0.5 * (1 + math.cos(math.pi * 8 / 9)), 0.07])
    annealed = trajectory(make_config(algorithm="diloco:inner_steps=2,outer_schedule=inner", lr=0.01))
    constant = trajectory(make_config(algorithm="diloco:inner_steps=2", lr=0.01))
    assert len(annealed) > 1 and all(torch.equal(a, b) for a, b in zip(annealed, constant, strict=True))
    scheduled = trajectory(make_config(algorithm="diloco:inner_steps=2", lr=0.01, lr_schedule=COSINE))
    both = trajectory(make_config(algorithm="diloco:inner_steps=2,outer_schedule=inner", lr=0.01, lr_schedule=COSINE))
    assert not torch.equal(scheduled[-1], both[-1])


def test_outer_schedule_names_its_choices(make_config):
    with pytest.raises(ConfigError, match="outer_schedule='cosine': valid choices are constant, inner"):
        Run(make_config(algorithm="diloco:outer_schedule=cosine"))


@pytest.mark.parametrize("keys, message", [
    ("merge=blend", "merge='blend': valid choices are mix, carry"),
    ("merge=carry,alpha=0.5", r"merge=carry keeps the local progress whole: alpha \(=0.5\) and eager apply to "
                              "merge=mix only"),
    ("merge=carry,eager=true", "merge=carry keeps the local progress whole"),
])
def test_merge_names_its_choices_and_refuses_what_does_not_apply(make_config, keys, message):
    with pytest.raises(ConfigError, match=message):
        Run(make_config(algorithm=f"streaming-diloco:inner_steps=4,fragments=2,overlap=2,{keys}", lr=0.01))


def test_carry_without_a_travelling_round_is_refused(make_config):
    """MuLoCo's rounds block by default (overlap 0): merge=carry would change nothing, so it says so."""
    with pytest.raises(ConfigError, match="merge=carry carries the progress made while a round travels; with "
                                          "overlap=0 .* give overlap >= 1"):
        Run(make_config(algorithm="muloco:inner_steps=3,merge=carry", lr=0.01))


def test_carry_with_the_whole_round_in_flight_learns_and_mix_alpha_0_is_refused(make_config):
    """τ = H: with merge=mix and α = 0 every inner step would be discarded (refused); carrying the
    progress keeps them, so the loss falls."""
    with pytest.raises(ConfigError, match="alpha=0 with overlap=3 = inner_steps discards every inner step.*"
                                          "merge=carry or eager=true"):
        Run(make_config(algorithm="muloco:inner_steps=3,overlap=3", lr=0.01))
    r = Run(make_config(algorithm="muloco:inner_steps=3,overlap=3,merge=carry", lr=0.01, workers=4))
    losses = [r.train_step()["loss"] for _ in range(40)]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
