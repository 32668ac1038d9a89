"""MuLoCo (arXiv:2505.23725, 2025): Muon (Jordan et al. 2024) as DiLoCo's inner
optimizer against a reference written here, quantised outer deltas with error feedback, resume."""

import math

import pytest
import torch

from gradwire.algorithms.muloco import Muon, MuonAdamW
from gradwire.algorithms.optim import AdamW
from gradwire.run.loop import Run
from tests.helpers import record_inner_steps, through_bytes


def reference_orthogonalise(u: torch.Tensor) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration as the blog post states it, five steps on the wide side."""
    x = u / (u.norm() + 1e-7)
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    for _ in range(5):
        a_mat = x @ x.T
        x = 3.4445 * x + (-4.7750 * a_mat + 2.0315 * a_mat @ a_mat) @ x
    return x.T if transposed else x


def test_muon_on_matrices_and_adamw_on_the_rest_match_a_reference():
    """An MLP's tensors (10x6 weight, bias 10, 3x10 weight, bias 3) in one flat vector: Muon with
    Nesterov momentum on the matrices, torch.optim.AdamW on the biases, five steps, float64."""
    shapes = [torch.Size([10, 6]), torch.Size([10]), torch.Size([3, 10]), torch.Size([3])]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(math.prod(s) for s in shapes), generator=g, dtype=torch.float64)
    tensors = [t.clone().view(s) for t, s in zip(x.split([math.prod(s) for s in shapes]), shapes)]
    ours = MuonAdamW(x, shapes,
                     muon=lambda w: Muon(w, lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.1),
                     adamw=lambda v: AdamW(v, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1))
    biases = [torch.nn.Parameter(tensors[1].clone()), torch.nn.Parameter(tensors[3].clone())]
    adamw = torch.optim.AdamW(biases, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    weights, buffers = [tensors[0].clone(), tensors[2].clone()], [torch.zeros(10, 6, dtype=torch.float64),
                                                                   torch.zeros(3, 10, dtype=torch.float64)]
    for _ in range(5):
        grad = torch.randn(x.numel(), generator=g, dtype=torch.float64)
        parts = [p.view(s) for p, s in zip(grad.split([math.prod(s) for s in shapes]), shapes)]
        ours.apply(grad)
        for i, gw in enumerate((parts[0], parts[2])):
            buffers[i] = 0.95 * buffers[i] + gw
            rows, cols = weights[i].shape
            weights[i] = weights[i] * (1 - 0.02 * 0.1) - 0.02 * max(1, rows / cols) ** 0.5 * \
                reference_orthogonalise(gw + 0.95 * buffers[i])
        biases[0].grad, biases[1].grad = parts[1].clone(), parts[3].clone()
        adamw.step()
    expected = torch.cat([weights[0].reshape(-1), biases[0].detach(), weights[1].reshape(-1), biases[1].detach()])
    torch.testing.assert_close(x, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("keys, mu, nesterov", [("muon_momentum=0.8,nesterov=false", 0.8, False),
                                                ("muon_momentum=0.6", 0.6, True),
                                                ("nesterov=false", 0.9, False)])  # μ: the default 0.9
def test_muloco_inner_steps_are_muon_with_the_spec_s_momentum(make_config, keys, mu, nesterov):
    """MuLoCo's inner steps on digits-mlp (float64, 2 workers, across three outer rounds) against Muon
    written here on the weight matrices: B <- μB + G; U = G + μB (Nesterov) or B; O = NewtonSchulz5(U/||U||_F)
    (Jordan's coefficients); W <- (1 - ηλ) W - η max(1, rows/cols)^½ O; and torch.optim.AdamW on the biases,
    both from each inner step's starting point with the worker's own state kept across rounds. μ, the
    Nesterov form, η (muon_lr 0.03) and λ (0.05) are the spec's, written as literals."""
    from tests.helpers import record_gradients

    lr, muon_lr, wd = 0.003, 0.03, 0.05
    r = Run(make_config(algorithm=f"muloco:inner_steps=3,muon_lr={muon_lr},weight_decay={wd},{keys}",
                        task="digits-mlp", dtype="float64", lr=lr, workers=2, steps=9))
    alg = r.algorithm
    shapes = [tuple(s) for s in r.model.shapes]
    sizes = [math.prod(s) for s in shapes]
    assert [len(s) for s in shapes] == [2, 1, 2, 1]  # two weight matrices (Muon), two biases (AdamW)
    grads = record_gradients(r)
    after_inner = record_inner_steps(alg)
    buffers = {w: [torch.zeros(s, dtype=torch.float64) for s in shapes if len(s) == 2] for w in range(2)}
    biases = {w: [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in shapes if len(s) == 1]
              for w in range(2)}
    adamw = {w: [torch.optim.AdamW([p], lr=lr, betas=(0.9, 0.99), eps=1e-8, weight_decay=wd) for p in b]
             for w, b in biases.items()}  # β2: MuLoCo's default 0.99
    for step in range(1, 10):
        before = {w: alg.replicas.x[w].clone() for w in range(2)}
        r.train_step()
        for w in range(2):
            tensors = [t.view(s) for t, s in zip(before[w].split(sizes), shapes)]
            parts = [g.view(s) for g, s in zip(grads[w].split(sizes), shapes)]
            expected, matrix, bias = [], 0, 0
            for t, g in zip(tensors, parts):
                if t.dim() == 2:
                    buffers[w][matrix] = mu * buffers[w][matrix] + g
                    u = g + mu * buffers[w][matrix] if nesterov else buffers[w][matrix]
                    rows, cols = t.shape
                    expected.append(t * (1 - muon_lr * wd) - muon_lr * max(1, rows / cols) ** 0.5 *
                                    reference_orthogonalise(u))
                    matrix += 1
                else:
                    p = biases[w][bias]
                    with torch.no_grad():
                        p.copy_(t)
                    p.grad = g.clone()
                    adamw[w][bias].step()
                    expected.append(p.detach().clone())
                    bias += 1
            torch.testing.assert_close(after_inner[w], torch.cat([e.reshape(-1) for e in expected]), rtol=0,
                                       atol=1e-12, msg=lambda m, s=step, k=w: f"worker {k} after step {s}: {m}")
    assert alg.outer[0].steps == 3  # three outer rounds: the inner state was kept across them


@pytest.mark.parametrize("compressor, spec", [(None, "sign:scaled=true"),  # the default message
                                               ("pquant:p=inf,block=32", "pquant")])  # stochastic: its generator
def test_muloco_learns_and_resumes_bitwise(make_config, compressor, spec):
    """MuLoCo (inner_steps=3) learns on digits-mlp, and a run resumed after 4 steps ends bit for bit
    where the run that never stopped does, with its default message and with a stochastic one."""
    cfg = make_config(algorithm="muloco:inner_steps=3", task="digits-mlp", lr=0.003, steps=12,
                      stragglers="lognormal:sigma=0.5,compute_s=0.05",
                      **({"compressor": compressor} if compressor else {}))
    straight = Run(cfg)
    before = straight.evaluate()["train_loss"]
    expected = [straight.train_step() for _ in range(12)]
    assert straight.evaluate()["train_loss"] < before
    assert straight.algorithm.averager.ef is not None and straight.algorithm.averager.spec().startswith(spec)
    first = Run(cfg)
    for _ in range(4):
        first.train_step()
    resumed = Run(cfg)
    resumed.load_state_dict(through_bytes(first.state_dict()))
    assert [resumed.train_step() for _ in range(8)] == expected[4:]
    assert torch.equal(resumed.algorithm.theta, straight.algorithm.theta)


@pytest.mark.parametrize("keys", ["overlap=2,alpha=0.5", "overlap=3,eager=true"])
def test_muloco_with_overlap_is_streaming_diloco_with_muon_inside(make_config, monkeypatch, keys):
    """``overlap`` (and ``alpha``, ``eager``) give MuLoCo Streaming DiLoCo's travelling round with one
    fragment: it equals streaming-diloco with the same keys whose inner optimizer is MuLoCo's, bitwise;
    and the round is resumed mid-flight."""
    from gradwire.algorithms.diloco import StreamingDiLoCo
    from gradwire.algorithms.muloco import MuLoCo

    # top-k: error feedback that scales nothing (a biased codec), which MuLoCo's rule and streaming-diloco's share
    common = dict(task="digits-mlp", lr=0.003, steps=12, compressor="topk:ratio=0.1", error_feedback=True)
    outer = f"inner_steps=3,outer_lr=1,outer_momentum=0.5,{keys}"
    ours = Run(make_config(common, algorithm=f"muloco:{outer},muon_lr_ratio=10"))
    rule = ours.algorithm
    monkeypatch.setattr(StreamingDiLoCo, "_inner_optimizer", lambda self, optim: MuLoCo._inner_optimizer(rule, optim))
    streaming = Run(make_config(common, algorithm=f"streaming-diloco:{outer},fragments=1", out="streaming"))
    losses = [(ours.train_step(), streaming.train_step()) for _ in range(12)]
    assert all(a == b for a, b in losses) and torch.equal(ours.algorithm.theta, streaming.algorithm.theta)
    assert ours.algorithm.carries_rounds
    monkeypatch.undo()
    first = Run(make_config(common, algorithm=f"muloco:{outer},muon_lr_ratio=10", out="first"))
    for _ in range(4):  # step 4: a round in flight (rounds start at 3, 6, ...)
        first.train_step()
    resumed = Run(make_config(common, algorithm=f"muloco:{outer},muon_lr_ratio=10", out="resumed"))
    resumed.load_state_dict(through_bytes(first.state_dict()))
    [resumed.train_step() for _ in range(8)]
    assert torch.equal(resumed.algorithm.theta, ours.algorithm.theta)


def test_muloco_spec_has_diloco_s_outer_warmup(make_config):
    """``outer_warmup`` is MuLoCo's own key (DiLoCo's ramp, default 10 rounds), and it ramps its μ."""
    from gradwire.algorithms.base import ALGORITHMS
    from gradwire.algorithms.diloco import OUTER_WARMUP

    assert "outer_warmup" in ALGORITHMS.entry("muloco").params
    default = Run(make_config(algorithm="muloco:inner_steps=3", task="digits-mlp", lr=0.003)).algorithm
    assert default.outer_warmup == OUTER_WARMUP == 10
    ramped = Run(make_config(algorithm="muloco:inner_steps=3,outer_warmup=2", task="digits-mlp", lr=0.003))
    assert [ramped.algorithm.outer_momentum_at(k) for k in range(4)] == pytest.approx([0, 0.35, 0.7, 0.7])
    constant = Run(make_config(algorithm="muloco:inner_steps=3,outer_warmup=0", task="digits-mlp", lr=0.003))
    for run in (ramped, constant):
        for _ in range(9):  # three outer rounds
            run.train_step()
    assert not torch.equal(ramped.algorithm.theta, constant.algorithm.theta)
    assert ramped.algorithm.outer[0].steps == 3


def test_scheduled_muon_steps_at_the_schedule_s_rate_and_resumes():
    """A scheduled Muon (cosine, warm-up 2, floor 0.1, over 6 updates) moves update k by η·f(k):
    the reference is the constant-η rule of the first test with η·f(k) written out; its update
    count is in the state, so a copy resumed at update 3 continues the schedule."""
    from gradwire.algorithms.optim import CosineLR

    g = torch.Generator().manual_seed(1)
    w0 = torch.randn(5, 8, generator=g, dtype=torch.float64)
    grads = [torch.randn(5, 8, generator=g, dtype=torch.float64) for _ in range(6)]
    spec = dict(lr_schedule="cosine:warmup=2,min_ratio=0.1", horizon=6)
    ours = Muon(w0.clone(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1, **spec)
    f = CosineLR(warmup=2, min_ratio=0.1)
    w, buffer = w0.clone(), torch.zeros_like(w0)
    for k, gk in enumerate(grads):
        ours.apply(gk)
        lr = 0.05 * f.factor(k, 6)
        buffer = 0.9 * buffer + gk
        w = w * (1 - lr * 0.1) - lr * reference_orthogonalise(gk + 0.9 * buffer)
        if k == 2:
            resumed = Muon(ours.w.clone(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1, **spec)
            resumed.load_state_dict({key: v.clone() if torch.is_tensor(v) else v
                                     for key, v in ours.state_dict().items()})
        elif k > 2:
            resumed.apply(gk)
    assert f.factor(0, 6) == 0.5 and f.factor(5, 6) < 0.3  # the rates differ: a constant η would not match
    torch.testing.assert_close(ours.w, w, rtol=0, atol=1e-12)
    assert torch.equal(resumed.w, ours.w)


def test_muon_lr_ratio_ties_muon_s_rate_to_lr_and_its_schedule(make_config):
    """``muon_lr_ratio=R``: every Muon part starts at R·--lr under --lr-schedule; the default keeps
    muon_lr constant; a negative ratio is refused with its value."""
    from gradwire.algorithms.muloco import MuLoCo
    from gradwire.errors import ConfigError

    cfg = make_config(algorithm="muloco:inner_steps=3,muon_lr_ratio=5", task="digits-mlp", lr=0.004, steps=12,
                      lr_schedule="cosine:warmup=2,min_ratio=0.1")
    muons = Run(cfg).algorithm.replicas.opt[0].muons
    assert muons and all(m.rate.base == pytest.approx(0.02) and not m.rate.constant and m.rate.horizon == 12
                         for m in muons)
    default = Run(make_config(algorithm="muloco:inner_steps=3", task="digits-mlp", lr=0.004, steps=12,
                              lr_schedule="cosine:warmup=2,min_ratio=0.1"))
    assert default.algorithm.replicas.opt[0].muons and \
        all(r.rate.constant and r.rate.base == 0.02 for r in default.algorithm.replicas.opt[0].muons)
    with pytest.raises((ConfigError, ValueError), match="muon_lr_ratio.*-1"):
        MuLoCo(muon_lr_ratio=-1)


JORDAN_ABC = (3.4445, -4.7750, 2.0315)
# Amsel, Persson, Musco, Gower 2025, "The Polar Express" (arXiv:2505.16932): the five per-iteration (a, b, c) of
# its 5-iteration schedule (safety factor 2e-2, cushion 2), as KellerJordan/modded-nanogpt's train_gpt.py
# publishes them; written here, not imported, so that the code's table is checked against them.
POLAR_EXPRESS_ABC = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                     (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                     (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                     (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                     (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))


def test_newton_schulz_coefficients_are_the_published_ones():
    """The code's tables equal the published numbers digit for digit, and each iteration count takes
    the first K of Polar Express's schedule (not, say, its last K) or Jordan's K times."""
    from gradwire.algorithms.muloco import NS_COEFFICIENTS, POLAR_EXPRESS, ns_coefficients_of

    assert NS_COEFFICIENTS == JORDAN_ABC
    assert POLAR_EXPRESS == POLAR_EXPRESS_ABC
    for steps in range(1, 6):
        assert ns_coefficients_of("polar-express", steps) == POLAR_EXPRESS_ABC[:steps]
        assert ns_coefficients_of("jordan", steps) == (JORDAN_ABC,) * steps


def plain_newton_schulz(u: torch.Tensor, coefficients, scale: float = 1.0) -> torch.Tensor:
    """X <- a X + b (X Xᵀ) X + c (X Xᵀ)² X, one (a, b, c) per iteration, from X = U / (scale ||U||_F + 1e-7),
    written out on the matrix as given (no transposition, no fused products)."""
    x = u / (scale * u.norm() + 1e-7)
    for a, b, c in coefficients:
        gram = x @ x.T
        x = a * x + b * gram @ x + c * gram @ gram @ x
    return x


@pytest.mark.parametrize("coefficients,steps", [("jordan", 5), ("jordan", 3), ("polar-express", 5),
                                                ("polar-express", 3)])
def test_newton_schulz_equals_the_plain_formula_on_matrices_and_batches(coefficients, steps):
    """The optimised iteration (short-side Gram matrix, fused baddbmm, batches, ping-pong buffers) against
    the formula written out, float64, on tall, wide and square matrices and a batch of tall ones."""
    from gradwire.algorithms.muloco import newton_schulz

    abc, scale = ((JORDAN_ABC,) * steps, 1.0) if coefficients == "jordan" else (POLAR_EXPRESS_ABC[:steps], 1.02)
    g = torch.Generator().manual_seed(3)
    for shape in [(5, 9), (9, 5), (7, 7), (3, 11, 6)]:
        u = torch.randn(*shape, generator=g, dtype=torch.float64)
        ours = newton_schulz(u, steps, coefficients=coefficients)
        expected = torch.stack([plain_newton_schulz(m, abc, scale) for m in u.reshape(-1, *shape[-2:])])
        torch.testing.assert_close(ours, expected.reshape(shape), rtol=0, atol=1e-12)
    assert newton_schulz(u, steps, coefficients=coefficients).dtype == torch.float64


def test_muon_adamw_updates_same_shaped_matrices_and_the_other_tensors_as_batches_with_the_same_result(device):
    """MuonAdamW updates its same-shaped matrices as one batch (two 6x4 apart in the flat vector, gathered;
    one 4x6, a view) and its other tensors (a 4 and a 6, apart) as one AdamW: three updates equal per-tensor
    Muon.apply and AdamW.apply on copies, float64; ns_steps and the coefficients reach it. Its state_dict
    holds one entry per tensor, in the per-tensor optimizers' layout, and a copy loaded from it goes on
    exactly as the original. On each device (CPU; CUDA where present: the gathers and scatters there)."""
    shapes = [torch.Size([6, 4]), torch.Size([4]), torch.Size([6, 4]), torch.Size([4, 6]), torch.Size([6])]
    sizes = [math.prod(s) for s in shapes]
    g = torch.Generator().manual_seed(4)
    x = torch.randn(sum(sizes), generator=g, dtype=torch.float64).to(device)
    settings = dict(lr=0.03, momentum=0.9, nesterov=True, weight_decay=0.1, ns_steps=3, ns_coefficients="polar-express")
    adamw_settings = dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    def build(v):
        return MuonAdamW(v, shapes, muon=lambda w: Muon(w, **settings), adamw=lambda u: AdamW(u, **adamw_settings))

    ours = build(x)
    assert [members for members, *_ in ours.groups] == [[0, 2], [3]] and ours.others == [1, 4]
    assert ours.ns_batches == [[0, 1]]  # the 6x4 pair and the 4x6: one Newton-Schulz batch, iterated as 4x6
    assert ours.groups[0][1].views is not None and ours.groups[1][1].views is None  # apart; a view
    assert ours.groups[0][1].value is None and isinstance(ours.groups[0][2].w, list)  # stepped where they lie
    copies = [(Muon if len(s) == 2 else AdamW)(t.clone().view(s), **(settings if len(s) == 2 else adamw_settings))
              for t, s in zip(x.split(sizes), shapes)]
    def own(rule):  # the tensor a per-tensor copy updates
        return rule.w if isinstance(rule, Muon) else rule.x

    for _ in range(3):
        grad = torch.randn(x.numel(), generator=g, dtype=torch.float64).to(device)
        ours.apply(grad)
        for rule, gm, s in zip(copies, grad.split(sizes), shapes):
            rule.apply(gm.view(s))
        # written from outside between updates (an outer step)
        moved = 0.1 * torch.randn(x.numel(), generator=g, dtype=torch.float64).to(device)
        x.add_(moved)
        for rule, m in zip(copies, moved.split(sizes)):
            own(rule).add_(m.view(own(rule).shape))
    for mine, rule in zip(x.split(sizes), copies):
        theirs = rule.w if isinstance(rule, Muon) else rule.x
        torch.testing.assert_close(mine, theirs.reshape(-1), rtol=0, atol=1e-12)
    state = ours.state_dict()
    assert sorted(state, key=int) == [str(i) for i in range(len(shapes))]
    for i, rule in enumerate(copies):
        assert state[str(i)].keys() == rule.state_dict().keys()
        for key, value in rule.state_dict().items():
            if torch.is_tensor(value):
                torch.testing.assert_close(state[str(i)][key], value.reshape(state[str(i)][key].shape),
                                           rtol=0, atol=1e-12)
                assert state[str(i)][key].shape == value.shape
            else:
                assert state[str(i)][key] == value == 3
    y, z = x.clone(), x.clone()
    resumed, from_old = build(y), build(z)
    resumed.load_state_dict(through_bytes(state))
    # a checkpoint in the per-tensor optimizers' own layout (what MuonAdamW wrote before it batched)
    from_old.load_state_dict(through_bytes({str(i): rule.state_dict() for i, rule in enumerate(copies)}))
    for _ in range(2):
        grad = torch.randn(x.numel(), generator=g, dtype=torch.float64).to(device)
        for opt in (ours, resumed, from_old):
            opt.apply(grad)
    assert torch.equal(x, y)
    torch.testing.assert_close(z, x, rtol=0, atol=1e-12)


def test_muloco_ns_steps_and_coefficients_reach_every_muon_and_are_validated(make_config):
    """``ns_steps`` / ``ns_coefficients`` (defaults 5, jordan: today's Muon) reach every Muon part; Polar
    Express has five iterations published, so a sixth is refused, as is an unknown name."""
    from gradwire.algorithms.muloco import MuLoCo
    from gradwire.errors import ConfigError

    def muons(spec):
        run = Run(make_config(algorithm=spec, task="digits-mlp", lr=0.004, steps=6))
        return run.algorithm.replicas.opt[0].muons

    assert {m.ns for m in muons("muloco:inner_steps=3")} == {(5, "jordan")}
    assert {m.ns for m in muons("muloco:inner_steps=3,ns_steps=3,ns_coefficients=polar-express")} == \
        {(3, "polar-express")}
    with pytest.raises((ConfigError, ValueError), match="polar-express has 5 iterations"):
        MuLoCo(ns_steps=6, ns_coefficients="polar-express")
    with pytest.raises((ConfigError, ValueError), match="ns_coefficients.*'newton'"):
        MuLoCo(ns_coefficients="newton")


def first_round_messages(r) -> dict:
    """Each worker's e + Δ of the first round (e = 0 then: Δ), recorded at the averager, after the round."""
    alg = r.algorithm
    seen = {}
    payloads = alg.averager.payloads

    def recorded(tensors, *, key):
        seen.update({rank: t.clone() for rank, t in tensors.items()})
        return payloads(tensors, key=key)

    alg.averager.payloads = recorded
    r.train_step()
    r.train_step()  # the first round
    assert seen
    return seen


def test_muloco_default_message_is_the_sign_times_the_mean_magnitude_with_its_residual_kept(make_config):
    """MuLoCo's default message (docs/defaults.md, eighth round) is EF-signSGD's scaled sign of e + Δ:
    in the first round (e = 0) each worker sends sign(Δ) · mean|Δ| (the mean rounded to float32), and
    the residual keeps Δ - Δ̂."""
    r = Run(make_config(algorithm="muloco:inner_steps=2,outer_warmup=0", task="digits-mlp", lr=0.003, workers=2))
    assert r.algorithm.averager.compressor.name == "sign"
    for rank, delta in first_round_messages(r).items():
        decoded = delta - r.algorithm.averager.ef[rank].residual("fragment0")
        scale = delta.abs().double().mean().float()
        nonzero = delta != 0
        assert nonzero.sum() > delta.numel() // 2
        torch.testing.assert_close(decoded[nonzero], torch.sign(delta[nonzero]) * scale, rtol=1e-6, atol=0)


def test_muloco_error_feedback_compresses_e_plus_delta_itself(make_config):
    """MuLoCo's rule (Thérien et al. 2025): Δ̂ = Q(e + Δ), e <- e + Δ - Δ̂, with nothing scaled. The 2-bit
    blocks of 32 (its default until 2026-11-30) are an unbiased quantiser with ω = 2.33, for which
    gradwire's generic error feedback would send Q(Δ / (1 + ω)): 30 % of each delta. So in the first
    round (e = 0) every block's kept values are ± that block's max |Δ| (rounded up to float32), and the
    residual is Δ - Δ̂."""
    r = Run(make_config(algorithm="muloco:inner_steps=2,outer_warmup=0", compressor="pquant:p=inf,block=32",
                        task="digits-mlp", lr=0.003, workers=2))
    alg = r.algorithm
    for rank, delta in first_round_messages(r).items():
        decoded = delta - alg.averager.ef[rank].residual("fragment0")  # what the first round sent
        n = delta.numel() // 32 * 32  # the whole blocks (a last partial block has its own max)
        top = delta[:n].view(-1, 32).abs().amax(1, keepdim=True)
        magnitudes = decoded[:n].view(-1, 32).abs()
        kept = magnitudes > 0
        assert kept.sum() > n // 4
        torch.testing.assert_close(magnitudes[kept], top.expand_as(magnitudes)[kept], rtol=1e-6, atol=0)


def test_parameter_roles_divide_a_network_as_muon_s_authors_do():
    """The transformer's token and position tables are embeddings, its head the output layer, the
    attention and MLP weights hidden, biases and LayerNorm gains vectors; an MLP's last Linear is its
    output layer and the others hidden; a FlatModel carries them in its tensors' order."""
    from gradwire.tasks.models import transformer_lm
    from gradwire.tasks.oracle import FlatModel, parameter_roles

    lm = transformer_lm(torch.Generator().manual_seed(0), vocab=16, context=8, dim=8, layers=2, heads=2,
                        dtype=torch.float32)
    roles = dict(zip((name for name, _ in lm.named_parameters()), parameter_roles(lm)))
    assert roles["embed.weight"] == roles["position"] == "embedding" and roles["head.weight"] == "output"
    hidden = {name for name, role in roles.items() if role == "hidden"}
    layers = ("attention.qkv", "attention.out", "mlp.0", "mlp.2")
    assert hidden == {f"blocks.{b}.{w}.weight" for b in range(2) for w in layers}
    assert {name for name, role in roles.items() if role == "vector"} == \
        {name for name, p in lm.named_parameters() if p.dim() == 1}
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6), torch.nn.ReLU(),
                              torch.nn.Linear(6, 3))
    assert parameter_roles(mlp) == ("hidden", "vector", "hidden", "vector", "output", "vector")
    assert FlatModel(mlp).roles == parameter_roles(mlp)

    class Attending(torch.nn.Module):  # torch's attention packs its input projections in one parameter
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(10, 8)
            self.attention = torch.nn.MultiheadAttention(8, 2)
            self.head = torch.nn.Linear(8, 10)

    attending = Attending()
    roles = dict(zip((name for name, _ in attending.named_parameters()), parameter_roles(attending)))
    assert roles == {"table.weight": "embedding", "attention.in_proj_weight": "hidden",
                     "attention.in_proj_bias": "vector", "attention.out_proj.weight": "hidden",
                     "attention.out_proj.bias": "vector", "head.weight": "output", "head.bias": "vector"}


def test_muloco_matrices_hidden_puts_embeddings_and_the_output_layer_on_adamw(make_config):
    """``matrices=hidden``: on the transformer, Muon updates only the hidden weights and AdamW the
    embeddings, the head and the vectors (the state holds a momentum buffer for the first, AdamW's
    moments for the others); the default (all) gives Muon every matrix; the run learns, resumes bit
    for bit, and an unknown value is refused in one line naming the valid ones."""
    from gradwire.algorithms.muloco import MuLoCo
    from gradwire.errors import ConfigError

    common = dict(task="stdlib-lm:dim=16,layers=1,heads=2,context=16,train_bytes=20000,val_bytes=2048", lr=0.004,
                  steps=8, eval_every=4, workers=2)
    run = Run(make_config(algorithm="muloco:inner_steps=2,matrices=hidden", **common))
    roles = run.ctx.param_roles
    opt = run.algorithm.replicas.opt[0]
    on_muon = sorted(i for members, _, _ in opt.groups for i in members)
    assert on_muon == [i for i, role in enumerate(roles) if role == "hidden"] and len(on_muon) == 4
    assert sorted(opt.others) == [i for i, role in enumerate(roles) if role != "hidden"]
    state = opt.state_dict()
    assert all(("buffer" in state[str(i)]) == (role == "hidden") for i, role in enumerate(roles))
    every = Run(make_config(algorithm="muloco:inner_steps=2", **common)).algorithm.replicas.opt[0]
    assert sorted(i for members, _, _ in every.groups for i in members) == \
        [i for i, role in enumerate(roles) if role != "vector"]
    before = run.evaluate()["train_loss"]
    expected = [run.train_step() for _ in range(8)]
    assert run.evaluate()["train_loss"] < before
    first = Run(make_config(algorithm="muloco:inner_steps=2,matrices=hidden", **common))
    for _ in range(3):
        first.train_step()
    resumed = Run(make_config(algorithm="muloco:inner_steps=2,matrices=hidden", **common))
    resumed.load_state_dict(through_bytes(first.state_dict()))
    assert [resumed.train_step() for _ in range(5)] == expected[3:]
    assert torch.equal(resumed.algorithm.theta, run.algorithm.theta)
    with pytest.raises((ConfigError, ValueError), match=r"^matrices must be one of all, hidden, got 'embeddings'$"):
        MuLoCo(matrices="embeddings")
