"""PowerSGD: rank-r gradient compression averaged by allreduce.

Vogels, Karimireddy, Jaggi (NeurIPS 2019), "PowerSGD: Practical low-rank gradient compression for
distributed optimization", Algorithms 1 and 2. Each matrix-shaped gradient M (a tensor of shape
(n, ...) viewed as n x m, m the product of the other sizes, as PyTorch's hook views it) is
approximated at rank r by one step of power iteration, warm-started from the previous step's Q:

    M_w = g_w + e_w                        error feedback: worker w adds what it lost last step
    P   = mean_w (M_w Q)                   allreduce 1 (a sum of products is a product of the sum)
    P^  = orthogonalise(P)                 Gram-Schmidt on the columns
    Q   = mean_w (M_w^T P^)                allreduce 2; kept as the next step's warm start
    M~  = P^ Q^T                           the same approximation of the mean at every worker
    e_w = M_w - M~                         the next step's error feedback

P and Q are means of per-worker matrices, so they travel by allreduce: the bytes per worker,
(n + m) r floats per matrix, do not grow with the number of workers, unlike an all-gather of
compressed payloads. Tensors where compression does not pay travel uncompressed in the first
allreduce, beside the Ps: vectors (biases), and matrices with ``n m <= rate (n + m) r``
(``min_compression_rate``, 2 by default as in PyTorch's hook). Two allreduces per step in all.

``dtype=fp16`` or ``bf16`` sends both allreduces in 16-bit floats: half the bytes at the same rank.
Each worker's factors (and its uncompressed tensors) are rounded to the wire dtype before the
allreduce and the mean is widened back; the rounding of Q is part of the approximation M~, so error
feedback carries it into the next step like the truncation error. (PyTorch gets the same bytes by
wrapping its hook in ``fp16_compress_wrapper``, which runs the whole hook in half precision; here
only what travels is rounded, the products stay in the gradient's dtype and the orthogonalisation
works in float32 at least.)
fp16 keeps 11 bits of mantissa but underflows below 6e-5; bf16 keeps float32's range with 8 bits.

``alternate=true`` is ACP-SGD (Zhang, Zhang, Shi, Chu, Li, ICDCS 2023, "Evaluation and Optimization
of Gradient Compression for Distributed Deep Learning"): one allreduce per step instead of two, P
and Q taking turns. The factor carried over from the last step is orthogonalised locally (it is
the same at every worker), so nothing waits between two collectives within a step:

    even compressed steps:  Q^ = orthogonalise(Q_last),  P = mean_w (M_w Q^),   M~ = P Q^^T
    odd compressed steps:   P^ = orthogonalise(P_last),  Q = mean_w (M_w^T P^),  M~ = P^ Q^T

Each step is the mean gradient projected on a rank-r subspace found from the previous step (one
power-iteration half-step per training step), with the same error feedback e_w = M_w - M~. It
sends n r floats per matrix on P steps and m r on Q steps: half of PowerSGD's (n + m) r on average,
in half the collectives, which is what lets a caller overlap it with the backward pass (the
paper's point: one collective per bucket, no orthogonalisation between two).

This is not a byte :class:`~gradwire.compress.Compressor` (a tensor in, a payload out, decoded
alone): it needs the tensors' shapes and runs two collectives with computation between them. It is
an :class:`~gradwire.averaging.base.Averager`, with a registry of its own, :data:`AVERAGERS`
(``gradwire list averagers``), and its spec goes where a compressor's does (``--compressor
powersgd:rank=4``); :meth:`PowerSGD.average` is the one implementation of the math, which the
algorithms' :class:`PowerSGDMean` (through ``Transport.allreduce_mean``, simulator and torch
backend alike) and the DDP hook (``gradwire.ddp``, through ``dist.all_reduce``) both call with
their own ``allreduce_mean``. Everything it remembers (Q per matrix, errors per worker and matrix,
the step count) is in :class:`PowerSGDMemory`, keyed by tensor name, so how tensors are grouped
(DDP's buckets) does not matter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from gradwire.averaging.base import Averager
from gradwire.compress.wire import power_of_two_below
from gradwire.errors import ConfigError
from gradwire.seeding import hash_seed
from gradwire.spec import Registry, Specced, require

# Kind "compressor": its specs are --compressor values, and errors should say so.
AVERAGERS = Registry("compressor")

# --compressor powersgd:dtype=...: what the two allreduces carry (None: the gradient's own dtype)
WIRE_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}

AllreduceMean = Callable[[dict[int, torch.Tensor]], torch.Tensor]  # one flat tensor per local worker -> mean


def orthogonalize_(matrix: torch.Tensor) -> torch.Tensor:
    """In place: the columns of ``matrix`` (n x r, or a batch b x n x r) made orthonormal by
    (modified) Gram-Schmidt, the paper's choice (Vogels 2019, Sec. 3: cheap for small r), each column
    projected twice against the earlier ones ("twice is enough": one pass leaves a column that was
    nearly in their span far from orthogonal to them: with one pass, a rank-1 mean at rank 2 came out
    7-85 % off, P^ P^T no projection). A column whose norm after the projections is at most 16 eps of
    its norm before becomes zero, as an exactly zero column stays zero (no NaN); on large matrices
    the rounding left of a dependent column can pass that and is normalised, but the second
    projection keeps it orthogonal, so P^ P^T is still a projection (tested: exact means).
    A batch runs r steps for all its matrices at once. Work in float32 at least (the caller's).
    Each column is first divided by the power of two at or below its largest |entry| (exact, and the
    result does not depend on a column's scale): a float32 column past about 1.8e19, or below 1e-19,
    had a norm of inf or 0 and came out all zeros."""
    matrix.div_(power_of_two_below(matrix.abs().amax(dim=-2, keepdim=True)))
    before = torch.linalg.vector_norm(matrix, dim=-2)  # (..., r)
    tol = 16 * torch.finfo(matrix.dtype).eps
    for i in range(matrix.shape[-1]):
        col = matrix[..., i]  # (..., n)
        if i:  # the second projection against the (orthonormal) columns before it
            done = matrix[..., :i]
            col.sub_((done @ (done.mT @ col.unsqueeze(-1))).squeeze(-1))
        norm = torch.linalg.vector_norm(col, dim=-1, keepdim=True)
        col.div_(torch.where(norm > 0, norm, torch.ones_like(norm)))  # no .item(): no GPU sync
        col.mul_((norm > tol * before[..., i: i + 1]).to(col.dtype))  # in the span: zero
        if i + 1 < matrix.shape[-1]:
            rest = matrix[..., i + 1:]  # (..., n, k)
            rest.sub_(col.unsqueeze(-1) * (col.unsqueeze(-2) @ rest))
    return matrix


def orthogonalized(matrices: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """New tensors: each of ``matrices`` (n_i x r_i) with orthonormal columns. Matrices of one shape,
    dtype and device are stacked and done as one batch. Up to 2 columns by :func:`orthogonalize_`
    (Gram-Schmidt); above, by Householder QR (``torch.linalg.qr``, in float32 at least) with each
    column's sign set so that R has a non-negative diagonal: the factor Gram-Schmidt computes, up to
    rounding, at a fraction of its cost (one LAPACK call instead of r column steps of small kernels:
    1.6 against 14 ms for the Ps of ``stdlib-lm`` (1.45M parameters) at rank 32, one CPU thread, per
    ``benchmarks/powersgd_cost.py``; PyTorch's hook switches at the same rank). A column that is
    exactly zero stays zero either way (its diagonal entry of R is 0)."""
    groups: dict[tuple, list[int]] = {}
    for k, m in enumerate(matrices):
        groups.setdefault((tuple(m.shape), m.dtype, m.device), []).append(k)
    out: list[torch.Tensor | None] = [None] * len(matrices)
    for (shape, dtype, _), members in groups.items():
        batch = torch.stack([matrices[k] for k in members])
        if shape[-1] <= 2:  # in float32 at least: a float16 column norm overflows past 65504
            batch = orthogonalize_(batch.to(torch.promote_types(dtype, torch.float32))).to(dtype)
        else:
            q, r = torch.linalg.qr(batch.to(torch.promote_types(dtype, torch.float32)))
            batch = (q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)).to(dtype)
        for j, k in enumerate(members):
            out[k] = batch[j]
    return out


def matrix_shape(shape: Sequence[int]) -> tuple[int, int] | None:
    """(n, m): the tensor as n = its first size rows by m = the rest (PyTorch's hook views conv
    weights this way too), or None for a scalar or vector, which PowerSGD never compresses."""
    if len(shape) < 2:
        return None
    return int(shape[0]), math.prod(int(s) for s in shape[1:])


@AVERAGERS.register(
    "powersgd", help="PowerSGD (Vogels 2019): rank-r power iteration with error feedback, averaged by two "
    "allreduces (bytes per worker constant in the number of workers); --compressor of sync (no backups) "
    "and the DDP hook",
    params={"rank": "approximation rank r (capped at min(n, m) of each matrix): lower compresses more",
            "min_compression_rate": "a matrix is compressed only if n*m > rate*(n+m)*r; else sent as it is",
            "start_step": "steps averaged uncompressed before PowerSGD starts (PyTorch's start_powerSGD_iter)",
            "warm_start": "start each power iteration from the previous step's Q (else from a fresh random Q)",
            "error_feedback": "add each worker's compression error to its next gradient (the paper's Alg. 2)",
            "dtype": "what the allreduces carry: fp32 (the gradient's own dtype), fp16 or bf16 (half the bytes)",
            "alternate": "ACP-SGD (Zhang 2023): one allreduce a step, P and Q taking turns (half the bytes "
                         "and half the collectives of PowerSGD; needs warm_start)"})
class PowerSGD(Specced):
    """The configuration and the math; the state lives in a :class:`PowerSGDMemory`."""

    name = "powersgd"

    def __init__(self, *, rank: int = 1, min_compression_rate: float = 2.0, start_step: int = 0,
                 warm_start: bool = True, error_feedback: bool = True, dtype: str = "fp32",
                 alternate: bool = False):
        require(rank >= 1, f"rank must be an integer >= 1, got {rank}")
        require(math.isfinite(min_compression_rate) and min_compression_rate > 0,
                f"min_compression_rate must be a finite number > 0, got {min_compression_rate}")
        require(start_step >= 0, f"start_step must be >= 0, got {start_step}")
        self.rank, self.min_compression_rate, self.start_step = rank, min_compression_rate, start_step
        require(dtype in WIRE_DTYPES, f"dtype must be one of {', '.join(WIRE_DTYPES)}, got {dtype!r}")
        self.warm_start, self.error_feedback, self.dtype = warm_start, error_feedback, dtype
        require(warm_start or not alternate, "alternate=true needs warm_start=true: each step starts from the "
                "factor the last step sent")
        self.alternate = alternate

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the allreduces carry for gradients of ``dtype``."""
        return WIRE_DTYPES[self.dtype] or dtype

    def matrix_rank(self, shape: Sequence[int]) -> int:
        """The rank this tensor is compressed at, or 0 when it travels uncompressed: vectors, and
        matrices where ``n m <= min_compression_rate (n + m) r``. r is capped at min(n, m), as in
        PyTorch's hook (a rank-min(n, m) approximation is already exact)."""
        nm = matrix_shape(shape)
        if nm is None:
            return 0
        n, m = nm
        r = min(self.rank, n, m)
        return r if n * m > self.min_compression_rate * (n + m) * r else 0

    def wire_numel(self, shapes: Sequence[Sequence[int]], factors: str = "pq") -> int:
        """Elements each worker contributes to the allreduces of one compressed step, numel per
        uncompressed tensor plus, per compressed matrix, ``factors``: "pq" (n + m) r (PowerSGD's two
        allreduces), "p" n r or "q" m r (one step of ``alternate``)."""
        require(factors in ("pq", "p", "q"), f"factors must be pq, p or q, got {factors!r}")
        total = 0
        for shape in shapes:
            r = self.matrix_rank(shape)
            if not r:
                total += math.prod(shape)
                continue
            n, m = matrix_shape(shape)
            total += r * ((n if "p" in factors else 0) + (m if "q" in factors else 0))
        return total

    def sends_p(self, memory: PowerSGDMemory, key: str) -> bool:
        """With ``alternate``: whether tensor ``key`` sends P at this step (even compressed steps, and
        whenever there is no P from the last step to start from), else Q."""
        return (memory.step - self.start_step) % 2 == 0 or key not in memory.p

    def average(self, memory: PowerSGDMemory, grads: dict[int, Sequence[torch.Tensor]], keys: Sequence[str],
                allreduce_mean: AllreduceMean) -> list[torch.Tensor]:
        """The mean over all workers of their gradients, PowerSGD-compressed: new tensors, one per
        entry of ``keys`` (same shapes and dtypes as the inputs). ``grads`` holds each local worker's
        tensors (not modified); ``allreduce_mean`` averages one flat tensor per local worker over
        every worker. Updates ``memory`` (Q, errors); the caller ends the step (``memory.step``)."""
        workers = sorted(grads)
        like = grads[workers[0]]
        # before start_step (PyTorch's start_powerSGD_iter) everything travels uncompressed
        ranks = [self.matrix_rank(t.shape) if memory.step >= self.start_step else 0 for t in like]
        packed = [i for i, r in enumerate(ranks) if r]
        plain = [i for i, r in enumerate(ranks) if not r]
        out: list[torch.Tensor | None] = [None] * len(like)

        # M_w = g_w + e_w (Vogels 2019, Alg. 2: error feedback), as n x m matrices
        matrices = {w: {i: self._corrected(memory, w, keys[i], grads[w][i]) for i in packed} for w in workers}
        if self.alternate and packed:
            return self._alternating(memory, grads, keys, allreduce_mean, ranks, packed, plain, matrices, out)
        qs = dict(zip(packed, orthogonalized([self._start_q(memory, keys[i], like[i], ranks[i]) for i in packed]),
                      strict=True))

        # allreduce 1: P = mean_w M_w Q (Alg. 1, line 3), and the uncompressed tensors
        round1 = {w: torch.cat([(matrices[w][i] @ qs[i]).reshape(-1) for i in packed]
                               + [grads[w][i].reshape(-1) for i in plain]) for w in workers}
        wire = self.wire_dtype(like[0].dtype)
        if round1[workers[0]].numel():
            mean = allreduce_mean({w: t.to(wire) for w, t in round1.items()}).to(like[0].dtype)
            sizes = [like[i].shape[0] * ranks[i] for i in packed] + [like[i].numel() for i in plain]
            pieces = mean.split(sizes)
            ps = dict(zip(packed, orthogonalized([pieces[k].view(-1, ranks[i]) for k, i in enumerate(packed)]),
                          strict=True))  # line 4
            for k, i in enumerate(plain):
                out[i] = pieces[len(packed) + k].view(like[i].shape).clone()
        if not packed:
            return out

        # allreduce 2: Q = mean_w M_w^T P^ (Alg. 1, lines 5-6); the next step's warm start
        round2 = {w: torch.cat([(matrices[w][i].T @ ps[i]).reshape(-1) for i in packed]) for w in workers}
        qbar = allreduce_mean({w: t.to(wire) for w, t in round2.items()}).to(like[0].dtype)
        pieces = qbar.split([matrices[workers[0]][i].shape[1] * ranks[i] for i in packed])
        for k, i in enumerate(packed):
            q = pieces[k].view(-1, ranks[i]).clone()
            memory.q[keys[i]] = q
            approx = ps[i] @ q.T  # M~ = P^ Q^T (Alg. 1, line 7)
            out[i] = approx.view(like[i].shape)
            if self.error_feedback:  # e_w = M_w - M~ (Alg. 2)
                for w in workers:
                    memory.errors.setdefault(w, {})[keys[i]] = matrices[w][i] - approx
        return out

    def _alternating(self, memory, grads, keys, allreduce_mean, ranks, packed, plain, matrices, out):
        """One step of ACP-SGD (``alternate``): one allreduce carrying, per compressed matrix, P = M Q^
        or Q = M^T P^ from the factor the last step sent, orthogonalised here, and the plain tensors."""
        workers = sorted(grads)
        like = grads[workers[0]]
        sends_p = {i: self.sends_p(memory, keys[i]) for i in packed}
        carried = [self._start_q(memory, keys[i], like[i], ranks[i]) if sends_p[i]
                   else self._revived(memory, keys[i], memory.p[keys[i]], "p") for i in packed]
        fixed = dict(zip(packed, orthogonalized(carried), strict=True))  # Q^ or P^, the same at every worker
        send = {w: torch.cat([(matrices[w][i] @ fixed[i] if sends_p[i] else matrices[w][i].T @ fixed[i]).reshape(-1)
                              for i in packed] + [grads[w][i].reshape(-1) for i in plain]) for w in workers}
        wire = self.wire_dtype(like[0].dtype)
        mean = allreduce_mean({w: t.to(wire) for w, t in send.items()}).to(like[0].dtype)
        shape = {i: matrix_shape(like[i].shape) for i in packed}
        sizes = ([shape[i][0 if sends_p[i] else 1] * ranks[i] for i in packed]
                 + [like[i].numel() for i in plain])
        pieces = mean.split(sizes)
        for k, i in enumerate(plain):
            out[i] = pieces[len(packed) + k].view(like[i].shape).clone()
        for k, i in enumerate(packed):
            factor = pieces[k].view(-1, ranks[i]).clone()
            if sends_p[i]:  # P = mean M Q^: M~ = P Q^^T
                memory.p[keys[i]], memory.q[keys[i]] = factor, fixed[i]
                approx = factor @ fixed[i].T
            else:           # Q = mean M^T P^: M~ = P^ Q^T
                memory.p[keys[i]], memory.q[keys[i]] = fixed[i], factor
                approx = fixed[i] @ factor.T
            out[i] = approx.view(like[i].shape)
            if self.error_feedback:  # e_w = M_w - M~, as PowerSGD's
                for w in workers:
                    memory.errors.setdefault(w, {})[keys[i]] = matrices[w][i] - approx
        return out

    def _corrected(self, memory: PowerSGDMemory, worker: int, key: str, grad: torch.Tensor) -> torch.Tensor:
        matrix = grad.reshape(grad.shape[0], -1)
        error = memory.errors.get(worker, {}).get(key) if self.error_feedback else None
        return matrix + error if error is not None else matrix

    def _start_q(self, memory: PowerSGDMemory, key: str, grad: torch.Tensor, r: int) -> torch.Tensor:
        """The Q this step's power iteration starts from (a copy, m x r): the previous step's Q with
        warm start (Vogels 2019, Sec. 3), else a seeded standard normal draw, the same at every
        worker. Drawn on the CPU then moved, so every device starts from the same Q. A kept Q is
        m x r: this averager made it, or its loader checked its rows and its rank."""
        m = grad[0].numel()
        if self.warm_start and key in memory.q:
            return self._revived(memory, key, memory.q[key], "q")
        if self.warm_start:
            return memory.first_draw(key, "q", (m, r), grad).clone()
        return _seeded_normal(hash_seed(memory.seed, "powersgd", key, memory.step), (m, r), grad)  # a new one each step

    def _revived(self, memory: PowerSGDMemory, key: str, factor: torch.Tensor, which: str) -> torch.Tensor:
        """A copy of the factor carried over from the last step, each column that is exactly zero
        replaced by that column of the factor's first draw. Power iteration keeps a zero column for
        good (M 0 = 0): after a step whose mean was exactly zero (a layer behind a zero-initialised
        one) the layer's mean would stay 0 and its error grow without end; after a step whose mean
        had rank below r (Gram-Schmidt leaves the extra columns zero) the rank would stay lost.
        Elementwise, with no host synchronisation (so the draw is kept at hand, cached: as much
        memory again as the factors); a factor with no zero column is returned as it is."""
        dead = factor.abs().amax(dim=0, keepdim=True) == 0
        return torch.where(dead, memory.first_draw(key, which, tuple(factor.shape), factor), factor)


def _seeded_normal(seed: int, shape: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
    """A standard normal draw of ``shape`` from ``seed``, drawn on the CPU (so every device gets the
    same numbers) then moved to ``like``'s device and dtype."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cpu", dtype=torch.float32).to(device=like.device, dtype=like.dtype)


class PowerSGDMemory:
    """What PowerSGD remembers between steps, in one process.

    ``q``: the last Q of each compressed tensor (by key), the allreduced mean, hence the same at
    every worker and kept once. ``errors``: each local worker's compression error per tensor (n x m).
    ``p``: with ``alternate``, the last P of each compressed tensor (the mean, or its orthonormal
    basis after a Q step), kept once like Q.
    ``step``: steps ended so far (``start_step``, and the draws without warm start, depend on it).
    ``seed``: the run's seed; the first Q of tensor ``key`` is drawn from ``hash_seed(seed,
    "powersgd", key, 0)``. ``state_dict()`` holds only tensors, ints and strings."""

    __slots__ = ("seed", "step", "q", "p", "errors", "_draws")

    def __init__(self, seed: int = 0):
        self.seed, self.step = int(seed), 0
        self.q: dict[str, torch.Tensor] = {}
        self.p: dict[str, torch.Tensor] = {}
        self.errors: dict[int, dict[str, torch.Tensor]] = {}
        self._draws: dict[tuple, torch.Tensor] = {}  # first_draw's cache: derived from the seed, not state

    def first_draw(self, key: str, which: str, shape: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
        """The seeded first Q (``which`` "q": the warm start's initial factor) or P ("p") of tensor
        ``key``, on ``like``'s device and dtype, the same at every worker; drawn once, then cached."""
        tag = (self.seed, key, which, shape, like.device, like.dtype)
        if tag not in self._draws:
            parts = ("powersgd", key, 0) if which == "q" else ("powersgd", key, "p")
            self._draws[tag] = _seeded_normal(hash_seed(self.seed, *parts), shape, like)
        return self._draws[tag]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "step": self.step, "q": dict(self.q), "p": dict(self.p),
                "errors": {str(w): dict(e) for w, e in self.errors.items()}}

    def load_state_dict(self, state: dict, *, shapes: dict[str, tuple[int, int]] | None = None) -> None:
        """Restore a :meth:`state_dict`. ``shapes`` (key -> (n, m)), where given, rejects Q and
        errors of unknown tensors or of the wrong size with a ConfigError."""
        if shapes is not None:
            bad = sorted({k for k, q in state["q"].items() if k not in shapes or q.shape[0] != shapes[k][1]}
                         | {k for k, p in state.get("p", {}).items() if k not in shapes or p.shape[0] != shapes[k][0]}
                         | {k for e in state["errors"].values() for k, t in e.items()
                            if k not in shapes or tuple(t.shape) != shapes[k]})
            if bad:
                raise ConfigError(f"powersgd state has Q or errors for unknown tensors or of the wrong size: {bad[:5]}")
        self.seed, self.step = int(state["seed"]), int(state["step"])
        self._draws.clear()  # drawn from the seed
        self.q = {k: q.clone() for k, q in state["q"].items()}
        self.p = {k: p.clone() for k, p in state.get("p", {}).items()}  # absent before alternate existed
        self.errors = {int(w): {k: t.clone() for k, t in e.items()} for w, e in state["errors"].items()}


class PowerSGDMean(Averager):
    """The averager of ``--compressor powersgd``: flat gradient vectors in, their PowerSGD mean out,
    through the transport's ``allreduce_mean`` (so the simulator and the torch backend run the same
    code and count the bytes themselves)."""

    carries_payloads = False  # two allreduces, with an orthogonalisation between them
    remembers_means = True  # Q (and P with alternate): a NaN mean would stay in every later step

    def __init__(self, spec: str, *, shapes: Sequence[torch.Size], workers: Sequence[int], seed: int,
                 keys: Sequence[str] | None = None):
        if not shapes:
            raise ValueError("powersgd needs the model's tensor shapes (Context.param_shapes)")
        self.powersgd: PowerSGD = AVERAGERS.build(spec)
        self.shapes = [torch.Size(s) for s in shapes]
        self.numels = [s.numel() for s in self.shapes]
        # what the memory is keyed by: the model's tensors in parameter order (the run), or their
        # names (the DDP hook, whose checkpoints have always been keyed by name)
        self.keys = [str(i) for i in range(len(self.shapes))] if keys is None else list(keys)
        self.workers = tuple(workers)
        self.memory = PowerSGDMemory(seed)

    def spec(self) -> str:
        return self.powersgd.spec()

    def mean(self, transport, tensors: dict[int, torch.Tensor], ranks=None) -> torch.Tensor:
        if ranks is not None:
            raise ValueError("powersgd averages over every worker (no backups)")
        grads = {w: [t.view(s) for t, s in zip(flat.split(self.numels), self.shapes, strict=True)]
                 for w, flat in tensors.items()}
        averaged = self.mean_tensors(transport, grads, range(len(self.shapes)))
        self.end_step()
        return torch.cat([t.reshape(-1) for t in averaged])

    def averages_buckets(self) -> bool:
        return True

    def mean_tensors(self, transport, tensors: dict[int, Sequence[torch.Tensor]],
                     indices: Sequence[int]) -> list[torch.Tensor]:
        """The PowerSGD mean of some of the model's tensors (``indices``, each worker's in that
        order): a bucket of ``sync:overlap``. The step ends with :meth:`end_step`."""
        return self.mean_tensors_by(transport.allreduce_mean, tensors, indices)

    def mean_tensors_by(self, allreduce_mean, tensors: dict[int, Sequence[torch.Tensor]],
                        indices: Sequence[int]) -> list[torch.Tensor]:
        return self.powersgd.average(self.memory, tensors, [self.keys[i] for i in indices], allreduce_mean)

    def end_step(self) -> None:
        self.memory.step += 1

    def set_step(self, step: int) -> None:
        self.memory.step = step

    def setup_info(self) -> dict:
        """What compression does to this model (algorithm.json): which tensors are compressed at
        which rank, and the floats (and bytes, for float32 gradients) each worker sends per step against
        plain allreduce's."""
        ranks = [self.powersgd.matrix_rank(s) for s in self.shapes]
        width = self.powersgd.wire_dtype(torch.float32).itemsize
        info = {"compressed": {k: r for k, r in zip(self.keys, ranks, strict=True) if r},
                "uncompressed": [k for k, r in zip(self.keys, ranks, strict=True) if not r]}
        if self.powersgd.alternate:  # P steps and Q steps take turns, and differ in size
            p, q = (self.powersgd.wire_numel(self.shapes, f) for f in ("p", "q"))
            info.update(floats_per_worker_p_step=p, floats_per_worker_q_step=q,
                        bytes_per_worker_p_step=p * width, bytes_per_worker_q_step=q * width)
        else:
            floats = self.powersgd.wire_numel(self.shapes)
            info.update(floats_per_worker_step=floats, bytes_per_worker_step=floats * width)
        return {"powersgd": {**info, "floats_uncompressed": sum(self.numels)}}

    def per_worker_state(self) -> tuple[str, ...]:
        return ("powersgd/errors",)  # each worker's error memory; Q and P are shared

    def state_dict(self) -> dict:
        return {"powersgd": self.memory.state_dict()}  # the key of the layout before averaging/ existed

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` saved with the same settings: Q, P or errors of unknown tensors
        or of the wrong size, and factors of another rank (a state saved at rank=2 loaded at rank=1,
        or a matrix this averager sends uncompressed), are one ConfigError. (Q restarted from a fresh
        draw would do for PowerSGD, but ACP-SGD's Q step starts from the saved P.)"""
        shapes = {k: matrix_shape(s) for k, s in zip(self.keys, self.shapes, strict=True) if len(s) >= 2}
        ranks = {k: self.powersgd.matrix_rank(s) for k, s in zip(self.keys, self.shapes, strict=True)}
        saved = state["powersgd"]
        other = sorted({(k, f.shape[-1]) for factors in (saved["q"], saved.get("p", {}))
                        for k, f in factors.items() if k in shapes and f.shape[-1] != ranks[k]})
        if other:
            k, r = other[0]
            now = f"compresses it at rank {ranks[k]}" if ranks[k] else "sends it uncompressed"
            raise ConfigError(f"powersgd state was saved at another rank: tensor {k!r} was compressed at rank {r}, "
                              f"this averager (rank={self.powersgd.rank}) {now} ({len(other)} tensor(s) differ); "
                              "load a state saved with the same powersgd settings, or start without it")
        self.memory.load_state_dict(saved, shapes=shapes)
