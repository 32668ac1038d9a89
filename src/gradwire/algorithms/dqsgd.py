"""DQ-SGD: QSGD whose number of levels is chosen every step (after Yan, Huang, Lan, Song 2021,
"DQ-SGD: Dynamic quantization in SGD for communication-efficient distributed learning", IEEE MASS;
arXiv:2107.14575). The paper minimises the bits sent subject to a bound on how much quantization
adds to SGD's convergence error; the rule below is our derivation of that idea for QSGD (see
docs/adaptive_compression.md for the derivation and how it differs from the paper).

The bound. For L-smooth f and x' = x - γ ĝ with ĝ = ḡ + q, ḡ = Σ_i p_i g_i the data-weighted
minibatch gradient and q the quantization noise (E[q | ḡ] = 0), the descent lemma gives
    E f(x') <= f(x) - γ ||∇f||² + (Lγ²/2) (E||ḡ||² + Q),   Q = E||q||² = Σ_i p_i² V_i,
V_i the conditional variance of worker i's QSGD rounding. If Q <= ε E||ḡ||², quantization multiplies
the second-order term by at most (1 + ε): for γ <= 1/(L(1+ε)), summing over T steps,
    (1/T) Σ_t E||∇f(x_t)||² <= 2(f(x_0) - f*)/(γT) + (1 + ε) Lγ (1/T) Σ_t V̄_t,
V̄_t the sampling variance of ḡ_t: quantization inflates the noise term by at most the factor 1 + ε.

The rule. Worker i takes the fewest bits b (s = 2^(b-1) - 1 levels, b = 2..8, the most levels a
b-bit symbol holds) such that p_i² V_i(s) <= ε R_t / N, where
  * V_i(s) = Σ_j (r/s)² f_j (1 - f_j), f_j = frac(s|g_ij|/r), r its bucket's norm: the exact variance
    of stochastic rounding for this gradient, which Alistarh et al. 2017, Lemma 3.1 bounds by
    min(B/s², √B/s) ||g_i||² (computed from the gradient, not the worst case);
  * R_t estimates E||ḡ_t||², which no worker knows before sending: each message carries its
    p_i² V_i(s_i) (4 bytes), so every rank knows the last step's Q exactly and ||ĝ||² - Q is an
    unbiased estimate of ||ḡ||² (E[||ĝ||² | ḡ] = ||ḡ||² + Q); R_t is its running mean over about ten
    steps (weight 0.1 on the newest, clipped at 0), and each worker uses its own ||g_i||² at step 1;
  * splitting ε R_t equally over workers minimises Σ_i bits_i when V ∝ 1/s or 1/s² (Lagrange).
As the minibatch noise comes to dominate the workers' gradients, ||ḡ||² falls relative to
Σ p_i² ||g_i||² and the rule asks for more levels: coarse early, finer later.

``bits_budget=b̄`` replaces the fixed ε by one tuned online so that the mean symbol bits per element
track b̄: log2 ε_{t+1} = log2 ε_t + (b_t - b̄), b_t this step's mean over workers (known to all). As
V ∝ 1/s on the √B/s branch, doubling ε removes about one bit, so this integral controller moves
one bit per bit of surplus. ``levels=s`` fixes s (the baseline with the same weighting and header).

Wire format: ``[uint8 s][float32 p_i² V_i(s), little-endian][qsgd payload for s and bucket B]``,
5 + 4·ceil(n/B) + ceil(n·b/8) bytes. Each step reports ``levels`` (every worker's s), ``bits`` (mean
bits per symbol), ``quant_variance`` Q = Σ_i p_i² V_i and ``bound`` ε R_t, so Q <= bound is
checkable from steps.jsonl.
"""

from __future__ import annotations

import math

import torch

from gradwire.algorithms.adaptive import data_shares, weighted_gather
from gradwire.algorithms.base import ALGORITHMS, Algorithm
from gradwire.algorithms.optim import make_optimizer
from gradwire.compress import CorruptPayload, Packet
from gradwire.compress.levels import bucket_norms, wire_scales
from gradwire.compress.qsgd import QSGD
from gradwire.compress.wire import work_dtype
from gradwire.spec import require

CANDIDATES = (1, 3, 7, 15, 31, 63, 127)  # s = 2^(b-1) - 1 for b = 2..8 bits per symbol
HEADER = 5        # uint8 s, float32 p_i² V_i
SMOOTHING = 0.1   # weight of the newest estimate of ||ḡ||² in the reference R
# The mode of a bare ``dqsgd``: the error-bound rule with ε = 1, i.e. quantization may at most double
# SGD's noise term ((1 + ε) in the bound above). Yan et al. 2021 (arXiv:2107.14575) pose DQ-SGD as
# "minimise the bits sent under a convergence-error constraint", so the default is a constraint, not
# a bit budget; ε = 1 is row 12 of the experiment in docs/adaptive_compression.md (2.9-3.1 bits per
# symbol, as accurate as the 3-bit budget of row 11).
DEFAULT_ERROR_BOUND = 1.0


def rounding_variance(x: torch.Tensor, scales: torch.Tensor, bucket: int, levels: int) -> float:
    """E||Q_s(x) - x||² given x, for QSGD's stochastic rounding with bucket scales ``scales``:
    an element at y = s|x|/r grid steps rounds to a neighbour with variance (r/s)² f (1 - f)."""
    xa = x.detach().reshape(-1).double().abs()
    full = xa.numel() // bucket * bucket
    total = 0.0
    for part, sc in ((xa[:full].view(-1, bucket), scales[: full // bucket]),
                     (xa[full:].view(1, -1), scales[full // bucket:])):
        if part.numel() == 0:
            continue
        step = sc.double().unsqueeze(1) / levels  # grid spacing r/s of each bucket
        y = torch.where(step > 0, part / step.clamp(min=1e-300), torch.zeros_like(part))
        f = y - y.floor()
        total += float((f * (1 - f) * step.square()).sum())
    return total


def bucket_scales(x: torch.Tensor, bucket: int) -> torch.Tensor:
    """The float32 bucket norms that QSGD puts on the wire for ``x``."""
    xf = x.detach().reshape(-1)
    return wire_scales(xf, bucket_norms(xf, bucket, 2, work_dtype(xf.dtype)), bucket, 2, "dqsgd")


def choose_levels(x: torch.Tensor, bucket: int, limit: float) -> tuple[int, float]:
    """The fewest-bit s in CANDIDATES with rounding variance <= limit (127 if none), and its variance."""
    xf = x.detach().reshape(-1)
    scales = bucket_scales(xf, bucket)
    for s in CANDIDATES:
        v = rounding_variance(xf, scales, bucket, s)
        if v <= limit:
            return s, v
    return CANDIDATES[-1], v


@ALGORITHMS.register(
    "dqsgd", help="DQ-SGD (Yan 2021): QSGD with levels chosen per step, fewest bits under an error bound",
    params={"error_bound": "ε: quantization variance Q <= ε·R, R a running estimate of ||ḡ||² (relative); "
                           f"ε = {DEFAULT_ERROR_BOUND:g} when no mode is given",
            "bits_budget": "mean bits per symbol b̄ in [2, 8]; ε is tuned online to meet it",
            "levels": "fixed s in 1..127 (no adaptation; the baseline with the same weighting)",
            "bucket": "QSGD bucket size B (one float32 norm per bucket)"})
class DQSGD(Algorithm):
    name = "dqsgd"
    default_lr = 0.8  # --lr when not given (docs/defaults.md)

    def __init__(self, *, error_bound: float = 0.0, bits_budget: float = 0.0, levels: int = 0,
                 bucket: int = 512):
        if not (error_bound or bits_budget or levels):
            error_bound = DEFAULT_ERROR_BOUND
        modes = {"error_bound": error_bound, "bits_budget": bits_budget, "levels": levels}
        given = [k for k, v in modes.items() if v]
        require(len(given) == 1, "dqsgd needs exactly one of error_bound=ε, bits_budget=b or levels=s, "
                f"got {', '.join(given)}")
        require(math.isfinite(error_bound) and error_bound >= 0,
                f"error_bound must be > 0, got {error_bound}")
        require(bits_budget == 0 or 2 <= bits_budget <= 8,
                f"bits_budget must be in [2, 8], got {bits_budget}")
        require(0 <= levels <= 127, f"levels must be in 1..127, got {levels}")
        require(bucket >= 1, f"bucket must be >= 1, got {bucket}")
        self.mode, self.value = given[0], modes[given[0]]
        self.error_bound, self.bits_budget, self.levels = error_bound, bits_budget, levels
        self.bucket = bucket

    def compressor_spec(self):  # the levels are chosen every step (steps.jsonl has them)
        return f"qsgd:bucket={self.bucket}" + (f",levels={self.levels}" if self.levels else " (levels per step)")

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require(codec.compressor == "none",
                f"dqsgd quantizes with its own QSGD; drop --compressor {codec.compressor!r}")
        require(not codec.error_feedback, "dqsgd takes no --error-feedback: QSGD is unbiased")
        self.world, self.d = ctx.world_size, params.numel()
        self.shares = data_shares(ctx.shard_sizes, ctx.world_size, "dqsgd")
        self.x = params.clone()
        self.opt = make_optimizer(self.x, optim)
        self.gen = {r: ctx.generator(r, "compress") for r in ctx.local_ranks}
        self.quantizers: dict[int, QSGD] = {}
        self.eps = self.error_bound or 1.0
        self.reference = -1.0  # R_t; negative until a first aggregate exists

    def quantizer(self, s: int) -> QSGD:
        if s not in self.quantizers:
            self.quantizers[s] = QSGD(levels=s, bucket=self.bucket)
        return self.quantizers[s]

    def pick(self, rank: int, g: torch.Tensor) -> tuple[int, float]:
        """This step's s for worker ``rank`` (p_i² V_i(s) <= ε R / N with the fewest bits) and p_i² V_i(s)."""
        p2 = float(self.shares[rank]) ** 2
        if self.levels:
            return self.levels, p2 * rounding_variance(g, bucket_scales(g, self.bucket), self.bucket, self.levels)
        ref = self.reference if self.reference >= 0 else float(g.double().square().sum())
        s, v = choose_levels(g, self.bucket, self.eps * ref / (self.world * p2))
        return s, p2 * v

    def _decode(self, rank: int, buffer: torch.Tensor) -> torch.Tensor:
        s = int(buffer[0])
        if not 1 <= s <= 127:
            raise CorruptPayload(f"dqsgd: worker {rank}'s header names {s} levels (expected 1..127)")
        return self.quantizer(s).decode(Packet(buffer[HEADER:], self.x.shape, self.x.dtype))

    def step(self, ctx, step):
        ctx.compute_all(step)
        losses, buffers = {}, {}
        for r in ctx.local_ranks:
            losses[r], g = ctx.gradient(r, self.x)
            s, q = self.pick(r, g)
            body = self.quantizer(s).encode(g, generator=self.gen[r]).buffer
            head = torch.tensor([q], dtype=torch.float32).view(torch.uint8)
            buffers[r] = torch.cat([torch.tensor([s], dtype=torch.uint8), head, body])
        agg, gathered = weighted_gather(ctx, buffers, self._decode, self.shares, self.x)
        self.opt.apply(agg)
        levels = [int(gathered[r][0]) for r in sorted(gathered)]
        quant = sum(float(gathered[r][1:HEADER].clone().view(torch.float32)) for r in sorted(gathered))
        bits = sum((2 * s).bit_length() for s in levels) / len(levels)
        info = {"loss": sum(losses.values()) / len(losses), "gradients": len(gathered), "levels": levels,
                "bits": bits, "quant_variance": quant, "error_bound": self.eps,
                "bound": self.eps * self.reference if self.reference >= 0 else None}
        signal = max(float(agg.double().square().sum()) - quant, 0.0)  # unbiased for ||ḡ||², clipped
        self.reference = signal if self.reference < 0 else (
            (1 - SMOOTHING) * self.reference + SMOOTHING * signal)
        if self.bits_budget:  # integral control of the mean bits; clamped so ε stays a float
            self.eps = 2.0 ** min(60.0, max(-60.0, math.log2(self.eps) + bits - self.bits_budget))
        return info

    def setup_info(self):
        return {"mode": self.mode, self.mode: self.value, "bucket": self.bucket,
                "candidate_levels": list(CANDIDATES), "shares": [round(float(p), 6) for p in self.shares]}

    def eval_params(self):
        return self.x

    def spec(self):  # not spec_of: only the mode in use, its value as repr
        return f"dqsgd:{self.mode}={self.value!r},bucket={self.bucket}"

    def per_worker_state(self) -> tuple[str, ...]:
        return ("generators",)  # each worker's quantiser draws

    def state_dict(self):
        return {"x": self.x, "opt": self.opt.state_dict(),
                "control": torch.tensor([self.eps, self.reference], dtype=torch.float64),
                "generators": {str(r): g.get_state() for r, g in self.gen.items()}}

    def load_state_dict(self, state):
        self.x.copy_(state["x"])
        self.opt.load_state_dict(state["opt"])
        self.eps, self.reference = (float(v) for v in state["control"])
        for r, g in self.gen.items():
            g.set_state(state["generators"][str(r)])
