"""DeMo: decoupled momentum; only the fast components of each worker's momentum travel.

Peng, Quesnelle, Kingma (2024), "DeMo: Decoupled Momentum Optimization", arXiv:2411.19870,
Algorithm 1. Every worker keeps its own momentum m, never averaged. At each step, with its
minibatch gradient g:

    m <- β m + g
    q  = ExtractFastComponents(m, s, k)  (DCT-II of every chunk of s elements, the k largest
                                          coefficients of each kept, the inverse DCT of those)
    m <- m - q                           (what is sent is removed locally; the rest keeps
                                          accumulating, as error feedback would keep it)
    Q  = Synchronize(q)                  (all-gather of every worker's q, averaged)
    x <- x - η sign(Q)                   (the authors' experiments use this sign-based (signum)
                                          update; ``sign=false``: x <- x - η Q, the algorithm box)

plus decoupled weight decay x <- (1 - ηλ) x before the step, as the authors' code applies it.

The message is gradwire's ``chunked-topk`` codec applied to the DCT coefficients (the transform is
orthonormal, so q and its coefficients carry the same information): k raw values per chunk in the
parameters' dtype, then Golomb-coded positions (``compress/chunked.py``). It is an all-gather,
so the bytes each worker receives grow with the workers (the paper's own caveat). Deviation: the
paper chunks each weight matrix into s×s tiles and takes a 2-D DCT; gradwire's parameters are one
flat vector, cut into 1-D chunks of s elements (the last chunk, shorter, has a DCT of its own size).
"""

from __future__ import annotations

import math

import torch

from gradwire.algorithms.base import ALGORITHMS, Algorithm, CodecConfig, make_averager, nested
from gradwire.algorithms.optim import ScheduledRate, require_sgd
from gradwire.algorithms.replicas import mean_or_nan
from gradwire.spec import require


def dct_matrix(size: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The orthonormal DCT-II matrix D (size × size): coefficients c = D v, inverse v = Dᵀ c."""
    j = torch.arange(size, dtype=torch.float64)
    d = torch.cos(math.pi * (2 * j.unsqueeze(0) + 1) * j.unsqueeze(1) / (2 * size)) * math.sqrt(2 / size)
    d[0] /= math.sqrt(2)
    return d.to(dtype=dtype, device=device)


class ChunkDCT:
    """The DCT of every chunk of ``chunk`` consecutive elements of a flat vector of n."""

    def __init__(self, n: int, chunk: int, dtype: torch.dtype, device):
        self.full, tail = divmod(n, chunk)
        self.chunk, self.n = chunk, n
        self.d = dct_matrix(chunk, dtype, device) if self.full else None
        self.d_tail = dct_matrix(tail, dtype, device) if tail else None

    def _apply(self, v: torch.Tensor, inverse: bool) -> torch.Tensor:
        out = torch.empty_like(v)
        cut = self.full * self.chunk
        if self.d is not None:
            rows = v[:cut].view(self.full, self.chunk)
            out[:cut].view(self.full, self.chunk).copy_(rows @ (self.d if inverse else self.d.T))
        if self.d_tail is not None:
            out[cut:] = v[cut:] @ (self.d_tail if inverse else self.d_tail.T)
        return out

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self._apply(v, inverse=False)

    def inverse(self, c: torch.Tensor) -> torch.Tensor:
        return self._apply(c, inverse=True)


DEMO_PARAMS = {
    "decay": "β in [0, 1): momentum decay m <- β m + g (the authors' code: 0.999)",
    "chunk": "s: elements per DCT chunk (the authors: tiles of about 64 × 64 of each matrix; here 1-D chunks)",
    "k": "DCT coefficients sent per chunk, 1..s (the authors' code: 32 per tile)",
    "sign": "true: x <- x - η sign(Q) (the paper's experiments); false: x <- x - η Q",
    "weight_decay": "λ >= 0: decoupled weight decay x <- (1 - ηλ) x",
}


@ALGORITHMS.register("demo", help="DeMo (Peng 2024): local momentum, the top-k DCT components of each chunk "
                     "all-gathered and removed locally, sign update", params=DEMO_PARAMS)
class DeMo(Algorithm):
    name = "demo"
    default_lr = 1e-2  # η when --lr is not given (docs/defaults.md): the sign update moves every element by η
    lr_scales_with_task = False  # a sign's step is in the parameters' units, not the gradient's

    def __init__(self, *, decay: float = 0.999, chunk: int = 64, k: int = 4, sign: bool = True,
                 weight_decay: float = 0.0):
        require(0 <= decay < 1, f"decay must be in [0, 1) (the momentum decay β), got {decay}")
        require(chunk >= 1 and 1 <= k <= chunk, f"need chunk >= 1 and k in [1, chunk]; got chunk={chunk}, k={k}")
        require(math.isfinite(weight_decay) and weight_decay >= 0,
                f"weight_decay must be a finite number >= 0, got {weight_decay}")
        self.decay, self.chunk, self.k, self.sign, self.weight_decay = decay, chunk, k, sign, weight_decay

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require_sgd(optim, self.name)
        require(not optim.momentum and not optim.weight_decay and not optim.nesterov,
                f"{self.name} keeps its own momentum (spec key decay) and weight decay (spec key weight_decay): "
                "--momentum, --nesterov and --weight-decay do not apply")
        require(codec.compressor == "none" and not codec.error_feedback,
                f"{self.name} sends the top-k of its momentum's DCT (spec keys chunk, k) and removes it locally: "
                "--compressor and --error-feedback do not apply")
        self.x = params.clone()
        self.momentum = {r: torch.zeros_like(params) for r in ctx.local_ranks}
        self.dct = ChunkDCT(params.numel(), self.chunk, params.dtype, params.device)
        message = CodecConfig(compressor=f"chunked-topk:chunk={self.chunk},k={self.k},values=raw")
        self.averager = make_averager(ctx, message)
        self.rate = ScheduledRate(optim.lr, optim.lr_schedule, optim.horizon)
        self.updates = 0

    @property
    def nesterov_instead(self):
        return "it keeps its own momentum (spec key decay), never averaged"

    def compressor_spec(self):
        return self.averager.spec()

    def step(self, ctx, step):
        ctx.compute_all(step)
        losses, payloads = [], {}
        for r in ctx.local_ranks:
            loss, g = ctx.gradient(r, self.x)
            losses.append(loss)
            m = self.momentum[r].mul_(self.decay).add_(g)
            coefficients = self.dct.forward(m)
            payloads[r] = self.averager.encode(r, coefficients).buffer
            m.sub_(self.dct.inverse(self.averager.decode(payloads[r], coefficients)))  # q leaves the momentum
        gathered = self.averager.gather(ctx.transport, payloads, coefficients)
        update = self.dct.inverse(self.averager.decode_mean(gathered, self.x))
        lr = self.rate.at(self.updates)
        self.updates += 1
        if self.weight_decay:
            self.x.mul_(1 - lr * self.weight_decay)
        self.x.sub_(update.sign() if self.sign else update, alpha=lr)
        return {"loss": mean_or_nan(losses), "gradients": ctx.world_size}

    def eval_params(self):
        return self.x

    def per_worker_state(self) -> tuple[str, ...]:
        return ("momentum",) + nested("codec", self.averager)

    def state_dict(self):
        return {"x": self.x, "momentum": {str(r): m for r, m in self.momentum.items()}, "updates": self.updates,
                "codec": self.averager.state_dict()}

    def load_state_dict(self, state):
        self.x.copy_(state["x"])
        for r, m in self.momentum.items():
            m.copy_(state["momentum"][str(r)])
        self.updates = int(state["updates"])
        self.averager.load_state_dict(state["codec"])
