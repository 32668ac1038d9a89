"""MuLoCo: DiLoCo with Muon as the inner optimizer and quantised outer deltas with error feedback.

"MuLoCo: Muon is a practical inner optimizer for DiLoCo" (2025),
arXiv:2505.23725: DiLoCo's loop (Douillard et al. 2023, Algorithm 1; ``diloco.py``) with
the inner AdamW replaced by Muon on the weight matrices, and the outer deltas compressed to 2 bits
with error feedback. Muon (Jordan, Jin, Boza, You, Cesista, Newhouse, Bernstein 2024, "Muon: an
optimizer for hidden layers in neural networks", blog post) on a matrix W with gradient G:

    B <- μ B + G;   U = G + μ B (Nesterov) or B
    O = NewtonSchulz5(U / ||U||_F)       (five iterations X <- a X + (b A + c A²) X, A = X Xᵀ,
                                          (a, b, c) = (3.4445, -4.7750, 2.0315): an approximate
                                          orthogonalisation U ≈ O S of the update's singular values)
    W <- (1 - ηλ) W - η max(1, rows/cols)^½ O

The iteration is most of Muon's cost (docs/time_to_accuracy.md, fourth pass): ``ns_steps`` sets how
many (default 5; three kept MuLoCo's quality on the time-to-quality benchmark), ``ns_coefficients``
whether each uses Jordan's (a, b, c) or the per-iteration ones of Polar Express (Amsel et al. 2025).

The other tensors (biases, 1-D parameters) take AdamW at ``--lr``. Muon's authors keep embeddings and
the output layer on AdamW too (``matrices=hidden``: the model's roles, ``tasks.oracle.parameter_roles``);
by default (``matrices=all``, the setting every table before 2026-11-30 measured) every 2-D tensor
takes Muon. The
model's tensor shapes come from the task (``ctx.param_shapes``); each tensor is a contiguous range
of the flat vector, and ``MuonAdamW`` updates the matrices of one shape as one batch, each in place, and
the other tensors as one AdamW, on a copy gathered from their ranges.

The outer deltas go through the averager with error feedback, residuals kept per replica
(``--error-feedback`` is implied; another ``--compressor`` may be named), as the paper writes it:
Δ̂ = Q(e + Δ), e <- e + Δ - Δ̂, with no 1/(1+ω) scaling of a non-contractive codec's input (gradwire's
generic rule, compress/error_feedback.py). By default Q is ``sign:scaled=true``: the sign of each
element times their mean magnitude (one float32 for the vector: EF-signSGD's scaled sign, Karimireddy
et al. 2019), 1 bit a parameter. Deviation: the paper quantises to 2 bits and more; here the 1-bit
message learned more on the default task's held-out seeds than the 2-bit ternary blocks of 32
(``pquant:p=inf,block=32``, 2.6 bits a parameter, the default until 2026-11-30) with 39 % of the bytes,
and as much on the CNN and on the time-to-quality transformer (docs/defaults.md, eighth round;
docs/time_to_accuracy.md, tenth pass).

Defaults: Muon's η 0.02 (Nesterov) as its authors give it, its momentum μ 0.9 (its authors': 0.95)
and the AdamW part's β2 0.99 (0.95 before): together with the 1-bit message the best of six settings
on the default task's held-out seeds (docs/defaults.md, eighth round). The outer step is DiLoCo's
Nesterov SGD at 0.7 with momentum 0.7, the best of five momenta on the default task's held-out seeds
(docs/defaults.md, 2026-11-29; 0.5 before, chosen when the scaled error feedback's residual acted as
a second momentum and 0.9 diverged).
Muon's η is constant by default (``--lr-schedule`` schedules the AdamW part only); with
``muon_lr_ratio=R`` it is R times --lr and follows --lr-schedule update by update, as the AdamW
part does, so that one rate (a learning-rate search's) sets and schedules both. H = 20 inner steps and the
AdamW part's --lr 0.01 (DiLoCo's) are the defaults that learned best on the default task
(docs/defaults.md).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from gradwire.algorithms.base import ALGORITHMS
from gradwire.algorithms.diloco import DILOCO_PARAMS, OUTER_WARMUP, STREAMING_PARAMS, DiLoCo, StreamingDiLoCo
from gradwire.algorithms.optim import AdamW, ScheduledRate
from gradwire.compress.wire import power_of_two_below
from gradwire.spec import require

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al. 2024, the same at every iteration
# Amsel, Persson, Musco, Gower 2025, "The Polar Express" (arXiv:2505.16932): a different quintic per
# iteration, each the minimax-optimal odd polynomial on the interval the previous one leaves, so the first
# K are (up to the safety margins) the best K-step composition. These five are the ones computed for
# 5 iterations with a safety factor of 2e-2 and cushion 2 (as KellerJordan/modded-nanogpt's train_gpt.py
# publishes them); the safety factor is the input's scale 1/(1.02 ||X||_F).
POLAR_EXPRESS = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                 (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                 (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                 (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                 (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))
NS_SCHEDULES = {"jordan": 1.0, "polar-express": 1.02}  # name -> the input's extra scale (safety factor)
MUON_MATRICES = ("all", "hidden")  # MuLoCo's matrices=: every 2-D tensor, or the hidden layers' weights


def ns_coefficients_of(name: str, steps: int) -> tuple[tuple[float, float, float], ...]:
    """The (a, b, c) of each of ``steps`` iterations: Jordan's at every one, or Polar Express's first
    ``steps``."""
    require(name in NS_SCHEDULES, f"ns_coefficients must be one of {sorted(NS_SCHEDULES)}, got {name!r}")
    require(steps >= 1, f"ns_steps must be >= 1, got {steps}")
    if name == "jordan":
        return (NS_COEFFICIENTS,) * steps
    require(steps <= len(POLAR_EXPRESS), f"polar-express has {len(POLAR_EXPRESS)} iterations, got ns_steps={steps}")
    return POLAR_EXPRESS[:steps]


def frobenius_normalized(x: torch.Tensor, extra: float = 1.0, eps: float = 1e-7) -> torch.Tensor:
    """Each matrix of the batch ``x`` (k, m, n) over (its Frobenius norm · ``extra`` + ``eps``), computed
    on the matrix divided by the power of two at or below its largest |entry| (exact), with eps divided
    alike, and never multiplied back: a float32 matrix whose sum of squares (past about 1.8e19 an entry)
    or whose norm itself (past about 3.4e38) leaves the range came out all zeros. Wherever the plain
    formula stays in range, the result is the same, bit for bit."""
    scale = power_of_two_below(x.abs().amax(dim=(-2, -1), keepdim=True))
    y = x / scale
    return y / (torch.linalg.matrix_norm(y, keepdim=True) * extra + eps / scale)


def newton_schulz(u: torch.Tensor, steps: int = 5, eps: float = 1e-7, coefficients: str = "jordan") -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration X <- a X + (b A + c A²) X, A = X Xᵀ, on a matrix (m, n) or
    a batch (k, m, n) of same-shaped matrices, each scaled by its own Frobenius norm, in the input's dtype.

    The cost is in the matrix products, so they are arranged for it: A is the Gram matrix of the short
    side (a tall matrix is iterated as its transpose: m ≤ n, A is m x m); b A + c A² and a X + (·) X are
    one fused ``baddbmm`` each; a batch of matrices goes through each product in one call; the iterates
    ping-pong between two buffers. The result equals the plain formula up to float rounding (tested
    against it in float64)."""
    abc = ns_coefficients_of(coefficients, steps)
    x = u if u.dim() == 3 else u[None]
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    x = frobenius_normalized(x, NS_SCHEDULES[coefficients], eps)
    k, m, n = x.shape
    y, gram, poly = x.new_empty(k, m, n), x.new_empty(k, m, m), x.new_empty(k, m, m)
    for a, b, c in abc:
        torch.bmm(x, x.mT, out=gram)
        torch.baddbmm(gram, gram, gram, beta=b, alpha=c, out=poly)
        torch.baddbmm(x, poly, x, beta=a, out=y)
        x, y = y, x
    x = x.mT if tall else x
    return x if u.dim() == 3 else x[0]


class Muon:
    """Muon on one matrix (m, n), or on a batch (k, m, n) of same-shaped matrices updated together
    (state: the momentum buffer and the update count, which a scheduled η (``lr_schedule``, as
    ``ScheduledRate``) is indexed by). An update is ``momentum_update`` (the matrices to orthogonalise),
    ``newton_schulz``, then ``step``. ``w``: the matrix or batch, or a list of same-shaped matrices
    (views of a flat vector, where they lie), stepped in place as a batch."""

    def __init__(self, w: torch.Tensor | list[torch.Tensor], *, lr: float, momentum: float, nesterov: bool,
                 weight_decay: float, lr_schedule: str = "constant", horizon: int = 0, ns_steps: int = 5,
                 ns_coefficients: str = "jordan"):
        self.w, self.momentum, self.nesterov, self.weight_decay = w, momentum, nesterov, weight_decay
        self.rate = ScheduledRate(lr, lr_schedule, horizon)  # η of each update
        ns_coefficients_of(ns_coefficients, ns_steps)  # validates
        self.ns = (ns_steps, ns_coefficients)  # Newton-Schulz: iterations, coefficients
        like = w[0] if isinstance(w, list) else w
        self.buffer = like.new_zeros((len(w), *like.shape)) if isinstance(w, list) else torch.zeros_like(w)
        self.scale = math.sqrt(max(1.0, like.shape[-2] / like.shape[-1]))
        self.steps = 0

    def momentum_update(self, grad: torch.Tensor) -> torch.Tensor:
        """B <- μ B + G; the matrix to orthogonalise, G + μ B (Nesterov) or B."""
        self.buffer.mul_(self.momentum).add_(grad)
        return torch.add(grad, self.buffer, alpha=self.momentum) if self.nesterov else self.buffer

    def step(self, orthogonal: torch.Tensor) -> None:
        """W <- (1 - ηλ) W - η max(1, rows/cols)^½ O, at this update's η."""
        lr = self.rate.at(self.steps)
        self.steps += 1
        if isinstance(self.w, list):  # each matrix where it lies: nothing gathered or scattered back
            if self.weight_decay:
                torch._foreach_mul_(self.w, 1 - lr * self.weight_decay)
            torch._foreach_add_(self.w, orthogonal.unbind(0), alpha=-lr * self.scale)
            return
        if self.weight_decay:
            self.w.mul_(1 - lr * self.weight_decay)
        self.w.add_(orthogonal, alpha=-lr * self.scale)

    def apply(self, grad: torch.Tensor) -> None:
        steps, coefficients = self.ns
        self.step(newton_schulz(self.momentum_update(grad), steps, coefficients=coefficients))

    def state_dict(self) -> dict:
        return {"buffer": self.buffer, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.copy_(state["buffer"])
        self.steps = int(state.get("steps", 0))  # checkpoints from before the count: a constant η needs none


class _Gathered:
    """Tensors at scattered ranges of a flat vector, worked on as one contiguous copy ``value``
    (viewed as ``shape``): ``gather`` copies them in, ``scatter`` back, ``of`` takes the same ranges of
    another vector (the gradient). Where the ranges are one run, ``value`` is a view and there is
    nothing to copy. ``copy=False``: no copy is kept (``value`` None where the ranges are apart), for an
    update that writes into the tensors where they lie (``views``). (Copies of slices: ``index_select``
    with a position per element was as slow as the per-tensor updates it replaced, on the CPU.)"""

    def __init__(self, x: torch.Tensor, ranges: list[tuple[int, int]], shape: tuple[int, ...], copy: bool = True):
        self.ranges, self.sizes, self.shape = ranges, [n for _, n in ranges], shape
        if all(a + n == b for (a, n), (b, _) in zip(ranges, ranges[1:])):
            self.run = slice(ranges[0][0], ranges[0][0] + sum(self.sizes))  # one run: a view, no copies
            self.views = None
            self.value = x[self.run].view(shape)
        else:
            self.views = [x[a: a + n] for a, n in ranges]
            self.value = x.new_empty(shape) if copy else None

    def of(self, v: torch.Tensor) -> torch.Tensor:
        if self.views is None:
            return v[self.run].view(self.shape)
        return torch.cat([v[a: a + n] for a, n in self.ranges]).view(self.shape)

    def gather(self) -> None:
        require(self.value is not None, "a _Gathered made with copy=False keeps no copy to gather into")
        if self.views is not None:
            torch.cat(self.views, out=self.value.view(-1))

    def scatter(self) -> None:
        require(self.value is not None, "a _Gathered made with copy=False keeps no copy to scatter from")
        if self.views is not None:
            torch._foreach_copy_(self.views, self.value.view(-1).split(self.sizes))


class MuonAdamW:
    """Muon on every 2-D tensor of a flat vector (or on those ``on_muon`` marks, one flag a tensor),
    AdamW on the others; ``apply`` takes the flat gradient.

    On a small model an update's cost is mostly per call, not per flop, so the work is batched: the
    matrices of one shape are one Muon on a (k, m, n) batch (one momentum update, one Newton-Schulz
    iteration, one step for all k; shapes that are each other's transpose share one Newton-Schulz
    batch), each matrix stepped where it lies in the flat vector; and the other tensors one AdamW on a
    contiguous copy, gathered from the flat vector before its update and scattered back after it (or a
    view, where its tensors are adjacent); the gradient's matrices are gathered into one batch.
    The arithmetic is elementwise or per matrix, so batching changes no result beyond float rounding;
    ``state_dict`` keeps one entry per tensor of ``shapes``."""

    def __init__(self, x: torch.Tensor, shapes, *, muon, adamw, on_muon=None):
        spans, start = [], 0
        for shape in shapes:
            spans.append((start, math.prod(shape), tuple(shape)))
            start += math.prod(shape)
        require(start == x.numel(), f"the model's tensor shapes cover {start} of its {x.numel()} parameters")
        on_muon = [len(shape) == 2 for shape in shapes] if on_muon is None else list(on_muon)
        require(len(on_muon) == len(spans) and all(len(spans[i][2]) == 2 for i, m in enumerate(on_muon) if m),
                f"Muon's tensors must be matrices among the model's {len(spans)} tensors, got {on_muon}")
        groups: dict[tuple, list[int]] = {}
        for i, (_, _, shape) in enumerate(spans):
            groups.setdefault(shape if on_muon[i] else (), []).append(i)
        others = groups.pop((), [])
        self.spans = spans
        # (tensor indices, their ranges (the gradient gathered from them), the Muon stepping them) per shape
        self.groups = []
        for shape, members in groups.items():
            gathered = _Gathered(x, [spans[i][:2] for i in members], (len(members), *shape), copy=False)
            target = gathered.value if gathered.views is None else [v.view(shape) for v in gathered.views]
            self.groups.append((members, gathered, muon(target)))
        # the groups whose matrices Newton-Schulz iterates as one wide shape, with one setting: one batch each
        batches: dict[tuple, list[int]] = {}
        for g, (_, gathered, rule) in enumerate(self.groups):
            m, n = gathered.shape[-2:]
            batches.setdefault((min(m, n), max(m, n), rule.ns), []).append(g)
        self.ns_batches = list(batches.values())
        self.others = others
        self.other = _Gathered(x, [spans[i][:2] for i in others], (sum(spans[i][1] for i in others),)) \
            if others else None
        self.adamw = adamw(self.other.value) if others else None

    @property
    def muons(self) -> list[Muon]:
        return [rule for _, _, rule in self.groups]

    def apply(self, grad: torch.Tensor) -> None:
        if self.adamw is not None:
            self.other.gather()
            self.adamw.apply(self.other.of(grad))
            self.other.scatter()
        updates = [rule.momentum_update(gathered.of(grad)) for _, gathered, rule in self.groups]
        for (_, _, rule), orthogonal in zip(self.groups, self._orthogonalised(updates)):
            rule.step(orthogonal)

    def _orthogonalised(self, updates: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each group's update through Newton-Schulz, the groups whose matrices are one shape up to a
        transpose in one batch: the iteration runs on the wide side, so a (256, 64) and a (64, 256) are
        both iterated as 64 x 256 (each matrix scaled by its own norm, as in a batch of one shape)."""
        out: list[torch.Tensor | None] = [None] * len(updates)
        for members in self.ns_batches:
            steps, coefficients = self.groups[members[0]][2].ns
            if len(members) == 1:
                out[members[0]] = newton_schulz(updates[members[0]], steps, coefficients=coefficients)
                continue
            tall = [updates[i].shape[-2] > updates[i].shape[-1] for i in members]
            wide = torch.cat([u.mT if t else u for u, t in zip((updates[i] for i in members), tall)])
            parts = newton_schulz(wide, steps, coefficients=coefficients).split([len(updates[i]) for i in members])
            for i, part, t in zip(members, parts, tall):
                out[i] = part.mT if t else part
        return out

    def _entries(self):
        """(index in ``shapes``, its state's views): one entry per tensor, as the checkpoint stores it."""
        for members, _, rule in self.groups:
            for j, i in enumerate(members):
                yield i, rule, {"buffer": rule.buffer[j]}
        offset = 0
        for i in self.others:
            size = self.spans[i][1]
            yield i, self.adamw, {"exp_avg": self.adamw.exp_avg[offset: offset + size],
                                  "exp_avg_sq": self.adamw.exp_avg_sq[offset: offset + size]}
            offset += size

    def state_dict(self) -> dict:
        return {str(i): {**views, "steps": rule.steps} for i, rule, views in sorted(self._entries(),
                                                                                     key=lambda e: e[0])}

    def load_state_dict(self, state: dict) -> None:
        for i, rule, views in self._entries():
            entry = state[str(i)]
            for key, view in views.items():
                view.copy_(entry[key])
            # every tensor of a batch steps together; checkpoints from before Muon's count have none
            rule.steps = int(entry.get("steps", 0))


def muon_matrices(matrices: str, shapes, roles, who: str) -> list[bool] | None:
    """Which of the model's tensors take Muon: None for ``all`` (every 2-D tensor), or a flag a tensor for
    ``hidden`` (the hidden layers' 2-D weights: ``roles``, tasks.oracle.parameter_roles; a convolution's
    are not matrices). A model with none is refused: Muon would update nothing."""
    if matrices == "all":
        return None
    require(len(roles) == len(shapes), f"{who}: matrices=hidden needs the model's tensor roles (which matrix is an "
                                       "embedding or the output layer)")
    on_muon = [role == "hidden" and len(shape) == 2 for role, shape in zip(roles, shapes)]
    require(any(on_muon), f"{who}: matrices=hidden leaves Muon no matrix on this model (its 2-D weights are "
                          "embeddings or the output layer, or it has none); use matrices=all")
    return on_muon


def muon_adamw(shapes, optim, *, muon_rate: dict, momentum: float, nesterov: bool, ns_steps: int,
               ns_coefficients: str, betas: tuple[float, float], eps: float, weight_decay: float, on_muon=None):
    """The builder of a flat vector's ``MuonAdamW``: Muon at ``muon_rate`` (its ``lr`` and, where
    scheduled, ``lr_schedule`` and ``horizon``) on the matrices (or on those ``on_muon`` marks), AdamW at
    ``optim``'s --lr and schedule on the rest, both decayed by ``weight_decay``. MuLoCo's inner optimizer
    and ``--optimizer muon``."""

    def muon(w):
        return Muon(w, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, ns_steps=ns_steps,
                    ns_coefficients=ns_coefficients, **muon_rate)

    def adamw(v):
        return AdamW(v, lr=optim.lr, betas=betas, eps=eps, weight_decay=weight_decay, l1=optim.l1,
                     lr_schedule=optim.lr_schedule, horizon=optim.horizon)

    return lambda x: MuonAdamW(x, shapes, muon=muon, adamw=adamw, on_muon=on_muon)


MULOCO_PARAMS = {
    "inner_steps": "H >= 1: inner steps (Muon on the matrices, AdamW on the rest) per outer round",
    "outer_lr": DILOCO_PARAMS["outer_lr"],
    "outer_momentum": DILOCO_PARAMS["outer_momentum"],
    "outer_warmup": DILOCO_PARAMS["outer_warmup"],
    "muon_lr": "η of Muon on the weight matrices (Muon's authors: 0.02), constant; other tensors: AdamW at --lr",
    "muon_lr_ratio": "R > 0: Muon's η is R·--lr instead of muon_lr, scheduled by --lr-schedule as the AdamW part "
                     "(0: muon_lr, constant)",
    "muon_momentum": "Muon's momentum μ (Muon's authors: 0.95; the default 0.9: docs/defaults.md)",
    "nesterov": "Muon's Nesterov form U = G + μ B (Muon's authors: true)",
    "matrices": "which matrices take Muon: all (every 2-D tensor: embeddings and the output layer too) or hidden "
                "(the hidden layers' weights; embeddings and the output layer take AdamW at --lr, as Muon's and "
                "MuLoCo's authors do)",
    "ns_steps": "K >= 1: Newton-Schulz iterations per Muon update (Muon's authors: 5); the iteration is most of "
                "Muon's cost",
    "ns_coefficients": "jordan: Muon's authors' (3.4445, -4.7750, 2.0315) at every iteration; polar-express: "
                       "Amsel et al. 2025's (arXiv:2505.16932) first ns_steps (<= 5) per-iteration quintics",
    "beta1": "AdamW β1 of the non-matrix tensors",
    "beta2": "AdamW β2 of the non-matrix tensors",
    "eps": DILOCO_PARAMS["eps"],
    "weight_decay": "decoupled weight decay λ of both inner optimizers",
    "overlap": STREAMING_PARAMS["overlap"] + " (Streaming DiLoCo's, with one fragment; 0: blocking rounds)",
    "alpha": STREAMING_PARAMS["alpha"],
    "eager": STREAMING_PARAMS["eager"],
    "merge": STREAMING_PARAMS["merge"],
}


@ALGORITHMS.register("muloco", help="MuLoCo (arXiv:2505.23725): DiLoCo with Muon inside and compressed "
                     "(1-bit scaled sign) outer deltas with error feedback", params=MULOCO_PARAMS)
class MuLoCo(DiLoCo):
    name = "muloco"
    default_compressor = "sign:scaled=true"

    def __init__(self, *, inner_steps: int = 20, outer_lr: float = 0.7, outer_momentum: float = 0.7,
                 outer_warmup: int = OUTER_WARMUP, muon_lr: float = 0.02, muon_lr_ratio: float = 0.0,
                 muon_momentum: float = 0.9, nesterov: bool = True, matrices: str = "all", ns_steps: int = 5,
                 ns_coefficients: str = "jordan", beta1: float = 0.9, beta2: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, overlap: int = 0, alpha: float = 0.0, eager: bool = False,
                 merge: str = "mix"):
        # DiLoCo's round (one fragment), travelling for ``overlap`` inner steps as Streaming DiLoCo's does
        # (0, the default: blocking, DiLoCo's own); the inner optimizer is Muon's (_inner_optimizer)
        StreamingDiLoCo.__init__(self, inner_steps=inner_steps, outer_lr=outer_lr, outer_momentum=outer_momentum,
                                 outer_warmup=outer_warmup, inner="adamw", beta1=beta1, beta2=beta2, eps=eps,
                                 weight_decay=weight_decay, fragments=1, overlap=overlap, alpha=alpha, eager=eager,
                                 merge=merge)
        require(math.isfinite(muon_lr) and muon_lr > 0, f"muon_lr must be a finite number > 0, got {muon_lr}")
        require(math.isfinite(muon_lr_ratio) and muon_lr_ratio >= 0,
                f"muon_lr_ratio must be a finite number >= 0 (0: muon_lr, constant), got {muon_lr_ratio}")
        require(0 <= muon_momentum < 1, f"muon_momentum must be in [0, 1), got {muon_momentum}")
        self.muon_lr, self.muon_lr_ratio, self.muon_momentum, self.nesterov = muon_lr, muon_lr_ratio, muon_momentum, \
            nesterov
        ns_coefficients_of(ns_coefficients, ns_steps)  # validates
        self.ns_steps, self.ns_coefficients = ns_steps, ns_coefficients
        require(matrices in MUON_MATRICES, f"matrices must be one of {', '.join(MUON_MATRICES)}, got {matrices!r}")
        self.matrices = matrices

    def setup(self, ctx, params, optim, codec):
        require(bool(ctx.param_shapes), f"{self.name} needs the model's tensor shapes (Muon works on matrices)")
        self.shapes = ctx.param_shapes
        self.on_muon = muon_matrices(self.matrices, self.shapes, ctx.param_roles, self.name)
        # the paper's error feedback on the outer deltas: e + Δ compressed as it is, not scaled by
        # 1/(1+ω) as gradwire's generic rule does for an unbiased codec with ω >= 1 (0.30 for the
        # 2-bit blocks of 32): that scaling sent 30 % of each delta and left the rest to the
        # residual, an extra momentum on top of the outer Nesterov step
        super().setup(ctx, params, optim, dataclasses.replace(codec, error_feedback=True, scaled_error_feedback=False))

    @property
    def nesterov_instead(self):
        return ("its inner Muon takes its Nesterov form and momentum from the spec (muloco:nesterov=true, the "
                "default, and muon_momentum), its AdamW part has moments of its own, and its outer step is Nesterov "
                "already (outer_momentum)")

    @property
    def updates_whole_matrices(self) -> bool:
        return True  # Muon orthogonalises each weight matrix whole

    def _inner_optimizer(self, optim):
        scheduled = self.muon_lr_ratio > 0
        rate = dict(lr=self.muon_lr_ratio * optim.lr, lr_schedule=optim.lr_schedule, horizon=optim.horizon) \
            if scheduled else dict(lr=self.muon_lr)
        return muon_adamw(self.shapes, optim, muon_rate=rate, momentum=self.muon_momentum, nesterov=self.nesterov,
                          ns_steps=self.ns_steps, ns_coefficients=self.ns_coefficients, betas=self.betas, eps=self.eps,
                          weight_decay=self.weight_decay, on_muon=self.on_muon)
