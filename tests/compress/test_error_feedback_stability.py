"""Error feedback stays bounded for every compressor: unbiased compressors that are not
contractions (omega >= 1) are scaled by 1/(1 + omega) before encoding (compress/error_feedback.py),
contractive ones are used as they are, and the wire format stays the compressor's own.

Unscaled, qsgd:levels=4 (omega = 5.66 with 512-element buckets) took the residual to thousands of
times the gradient within a few dozen steps; see tests/algorithms/test_error_feedback_convergence.py
for whole runs."""

from __future__ import annotations

import math

import pytest
import torch

from gradwire.compress import REGISTRY, ErrorFeedback, Packet, build
from gradwire.compress.error_feedback import ef_scale

# every registered compressor on its defaults, and the settings that are furthest from a contraction
SPECS = REGISTRY.names() + ["qsgd:levels=4", "qsgd:levels=1", "pquant:p=1", "pquant:p=2", "terngrad:clip=0",
                            "randk:ratio=0.1", "sign:scaled=true", "qsgd:levels=127"]
N = 2048


def delta(spec: str, n: int = N) -> float | None:
    """The contraction factor of what error feedback sends: E||C'(v) - v||^2 <= (1 - delta)||v||^2,
    where the compressor declares enough to know it (None otherwise)."""
    c = build(spec)
    lam = ef_scale(c, n)
    omega = c.omega(n)
    if lam < 1:
        return lam                       # scaled unbiased compressor: delta = 1/(1 + omega)
    if c.unbiased and omega is not None:
        return 1 - omega                 # unbiased with omega < 1 (none, natural, qsgd with many levels)
    if omega is not None:
        return 1 - omega                 # topk: omega() is its contraction factor 1 - k/n
    if c.name == "sign" and c.scaled:
        return 1 / n                     # mean|v|·sign(v): delta = ||v||_1^2 / (n ||v||^2) >= 1/n
    return None


# lam = 1/(1 + omega) where a compressor is unbiased with omega >= 1 (Stich & Karimireddy 2020;
# Beznosikov et al. 2020: C/(1 + omega) is a 1/(1 + omega)-contraction), with each paper's omega
# written out for N = 2048 elements and the default 512-element buckets (d = 512):
#   qsgd, s levels: omega = min(d/s^2, sqrt(d)/s) (Alistarh et al. 2017, Lemma 3.1)
#   pquant: omega = 1/alpha_p(d) - 1, alpha_1 = 1/d, alpha_2 = 1/sqrt(d), alpha_inf = 2/(1 + sqrt(d))
#     (Mishchenko et al. 2019)
#   terngrad:clip=0 (pquant-inf over one block of N): omega = (1 + sqrt(N))/2 - 1
#   randk, k = ceil(ratio N): omega = N/k - 1, so lam = k/N (k = 21 for 0.01, 205 for 0.1)
# and 1 for the rest: natural (omega = 1/8), qsgd with 127 levels (omega = 512/127^2 = 0.032), none
# (omega = 0), and the biased codecs (topk, chunked-topk, threshold, sign, clipped terngrad, casts).
D = 512
LAMBDA = {
    "qsgd": 1 / (1 + min(D / 7**2, math.sqrt(D) / 7)),
    "qsgd:levels=4": 1 / (1 + min(D / 4**2, math.sqrt(D) / 4)),
    "qsgd:levels=1": 1 / (1 + min(D / 1**2, math.sqrt(D) / 1)),
    "pquant": 1 / (1 + (1 + math.sqrt(D)) / 2 - 1),
    "pquant:p=1": 1 / D,
    "pquant:p=2": 1 / math.sqrt(D),
    "terngrad:clip=0": 1 / (1 + (1 + math.sqrt(N)) / 2 - 1),
    "randk": 21 / N,
    "randk:ratio=0.1": 205 / N,
}


def test_the_rule():
    """ef_scale is 1/(1 + omega) for the paper's omega where unbiased and omega >= 1, and 1 elsewhere."""
    for spec in SPECS:
        assert ef_scale(build(spec), N) == pytest.approx(LAMBDA.get(spec, 1.0), rel=1e-12), spec
    assert set(LAMBDA) < set(SPECS)
    assert ef_scale(build("qsgd:levels=4"), 4096) == pytest.approx(1 / (1 + math.sqrt(512) / 4))
    assert ef_scale(build("qsgd:levels=4"), 100) == pytest.approx(1 / (1 + math.sqrt(100) / 4))  # d = n < B
    assert ef_scale(build("randk:ratio=0.01"), 1000) == pytest.approx(0.01)  # rand-k with memory
    # the boundary: omega = 1 exactly is scaled (qsgd s = 2, d = 4: min(4/4, 2/2); pquant-1 with d = 2)
    assert ef_scale(build("qsgd:levels=2,bucket=4"), N) == 0.5
    assert ef_scale(build("pquant:p=1,block=2"), N) == 0.5
    assert ef_scale(build("qsgd:levels=3,bucket=4"), N) == 1.0  # omega = min(4/9, 2/3) < 1


@pytest.mark.parametrize("spec", ["topk", "sign:scaled=true", "natural", "terngrad", "threshold:tau=0.5", "fp16",
                                  "qsgd:levels=127"])
def test_contractive_compressors_send_exactly_what_they_did(spec):
    """No scaling where none is needed: the packet is the compressor's encoding of x + residual."""
    ef, c = ErrorFeedback(build(spec)), build(spec)
    g = torch.Generator().manual_seed(3)
    residual = torch.zeros(N)
    for step in range(5):
        x = torch.randn(N, generator=g)
        state = g.get_state()
        packet = ef.encode(x, key="w", generator=g)
        g2 = torch.Generator()
        g2.set_state(state)
        expected = c.encode(x + residual, generator=g2)
        assert torch.equal(packet.buffer, expected.buffer), (spec, step)
        residual = x + residual - c.decode(expected)
        assert torch.equal(ef.residual("w"), residual)


@pytest.mark.parametrize("spec", ["qsgd:levels=4", "pquant", "randk", "terngrad:clip=0"])
def test_scaled_compressors_keep_the_identity_and_the_wire_format(spec):
    """x + residual_before == decode(packet) + residual_after, and a receiver that knows nothing
    of error feedback decodes the bytes with the plain compressor."""
    ef, receiver = ErrorFeedback(build(spec)), build(spec)
    g = torch.Generator().manual_seed(0)
    before = torch.zeros(N, dtype=torch.float64)
    for _ in range(20):
        x = torch.randn(N, generator=g)
        packet = ef.encode(x, key="w", generator=g)
        assert packet.nbytes == receiver.nbytes(N, torch.float32)
        decoded = receiver.decode(Packet(packet.buffer.clone(), torch.Size([N]), torch.float32))
        assert torch.equal(decoded, ef.decode(packet))
        after = ef.residual("w").double()
        torch.testing.assert_close(x.double() + before, decoded.double() + after, rtol=1e-5, atol=1e-5)
        before = after


def test_scaled_randk_is_randk_with_memory():
    """randk scaled by k/n sends the kept elements of x + residual as they are, up to rounding (the
    memory variant of Stich et al. 2018), and keeps the others."""
    ef = ErrorFeedback(build("randk:ratio=0.1"))
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    sent = ef.decode(ef.encode(x, key="w", generator=torch.Generator().manual_seed(2)))
    kept = sent != 0
    assert int(kept.sum()) == 100
    torch.testing.assert_close(sent[kept], x[kept], rtol=1e-6, atol=0)
    assert float(ef.residual("w")[kept].abs().max()) <= 1e-6 * float(x.abs().max())  # float rounding of k/n
    assert torch.equal(ef.residual("w")[~kept], x[~kept])


@pytest.mark.parametrize("spec", ["qsgd:levels=4", "qsgd:levels=1", "pquant:p=2", "randk", "terngrad:clip=0"])
def test_scaled_compressor_is_a_contraction(spec):
    """E||C(lam v) - v||^2 <= (1 - lam)||v||^2 with lam = 1/(1 + omega), on a flat vector (the
    worst case of the L2-scaled quantizers) and a Gaussian one; 200 draws."""
    c, n = build(spec), 512
    lam = ef_scale(c, n)
    assert lam < 1
    g = torch.Generator().manual_seed(5)
    for v in (torch.ones(n), torch.randn(n, generator=g)):
        err = sum(float((c.decode(c.encode(v * lam, generator=g)) - v).pow(2).sum()) for _ in range(200)) / 200
        assert err <= (1 - lam) * float(v.pow(2).sum()) * 1.05, (spec, err)


def _residual_ratios(spec: str, steps: int = 400) -> tuple[list[float], float]:
    """||residual|| / ||x|| over a stream of gradients x = a fixed heavy-tailed direction plus as
    much noise (scaled 0.01), and the largest |residual| element."""
    ef = ErrorFeedback(build(spec))
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(N, generator=g) * torch.rand(N, generator=g).pow(4) * 10
    ratios, biggest = [], 0.0
    for _ in range(steps):
        x = 0.01 * (mean + torch.randn(N, generator=g))
        ef.encode(x, key="w", generator=g)
        r = ef.residual("w")
        ratios.append(float(r.norm() / x.norm()))
        biggest = max(biggest, float(r.abs().max()))
    return ratios, biggest


# Steps of the stream per spec (400 unless listed): the slow contractions need longer to settle, and
# randk and clipped terngrad were still rising between steps 100-200 and 300-400 (1.36x; 1.27x, and
# 1.46x with ATEN_CPU_CAPABILITY=default).
STEPS = {"pquant:p=1": 3200, "sign:scaled=true": 3200, "randk": 800, "terngrad": 800}
# Bound on max ||residual|| / ||x|| over the stream, 2.1-2.7x the maximum measured with these
# seeds (torch 2.13 on the CPU; also with ATEN_CPU_CAPABILITY=avx2 and =default, where fp16, terngrad,
# chunked-topk and qsgd:levels=127 moved by at most 7 %); never above the theory's
# max(10, 3/delta) where delta is known (randk: 1.8x, randk:ratio=0.1: 1.8x, capped by it).
BOUNDS = {
    "none": 0.0,                 # measured 0 (lossless)
    "fp16": 6e-4,                # 2.46e-4
    "bf16": 5e-3,                # 1.90e-3
    "threshold": 0.01,           # 4.38e-3 (tau = 1e-3)
    "natural": 1.0,              # 0.410
    "qsgd:levels=127": 0.2,      # 0.0752
    "qsgd": 8.0,                 # 3.65
    "qsgd:levels=4": 15.0,       # 6.57
    "qsgd:levels=1": 60.0,       # 27.0
    "pquant": 25.0,              # 11.7 (p = inf)
    "pquant:p=2": 55.0,          # 25.9
    "pquant:p=1": 1100.0,        # 527 at 3200 steps (273 at 400)
    "terngrad:clip=0": 50.0,     # 23.2
    "terngrad": 35.0,            # 15.5 at 800 steps (16.1 with ATEN_CPU_CAPABILITY=default)
    "randk": 290.0,              # 161 at 800 steps
    "randk:ratio=0.1": 29.0,     # 16.3
    "topk": 40.0,                # 19.0
    "chunked-topk": 30.0,        # 12.3
    "sign": 60.0,                # 27.8 (the first step: x is small, the signs are +-1)
    "sign:scaled=true": 320.0,   # 152 at 3200 steps (65 at 400)
}


def test_every_spec_has_a_bound():
    assert set(BOUNDS) == set(SPECS)
    for spec, bound in BOUNDS.items():
        d = delta(spec)
        assert d is None or bound <= max(10.0, 3 / d), spec  # E||e||^2 <= 4(1 - delta)/delta^2 G^2


@pytest.mark.parametrize("spec", SPECS)
def test_residual_stays_bounded(spec):
    """Within BOUNDS (measured, tighter than the theory's max(10, 3/delta) times the gradient for a
    delta-contraction: E||e||^2 <= 4(1 - delta)/delta^2 G^2, Stich & Karimireddy 2020), and not
    growing: over T steps, the last quarter averages at most 1.5x the second (linear growth gives 2.3x).
    Without the scaling, qsgd:levels=4 passed 1000x within 30 steps. Scaled sign only has
    delta >= 1/n: its residual creeps up for thousands of steps (65x at 400, 152x at 3200, 164x at
    8000; the last quarter 1.80x the second at 400 steps, 1.30x at 3200), and pquant:p=1 (delta = 1/512)
    settles by about 3200 steps (1.99x at 400, 1.11x at 3200)."""
    steps = STEPS.get(spec, 400)
    ratios, biggest = _residual_ratios(spec, steps)
    assert all(math.isfinite(r) for r in ratios), spec
    assert max(ratios) <= BOUNDS[spec], (spec, max(ratios))
    q = steps // 4
    assert sum(ratios[-q:]) <= 1.5 * sum(ratios[q: 2 * q]), (spec, sum(ratios[-q:]), sum(ratios[q: 2 * q]))
    if spec == "sign":
        # unscaled sign sends +-1 whatever the tensor's scale: its residual is bounded per element
        # (|e_i| <= 1 while every |x_i| <= 1), not relative to ||x||
        assert biggest <= 1.0
    if spec.startswith("threshold"):
        assert biggest < build(spec).tau  # everything at or above tau is sent exactly
