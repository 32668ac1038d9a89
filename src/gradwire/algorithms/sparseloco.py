"""SparseLoCo: DiLoCo whose outer momentum is a per-replica error-feedback accumulator, sent as a
chunked top-k of 2-bit-class values.

Sarfi, Thérien, Lidin, Belilovsky (2025), "Communication Efficient LLM Pre-training with
SparseLoCo", arXiv:2508.15706, Algorithm 1. Each replica r starts round t from the shared θ, takes
H inner AdamW steps to θ_r, then

    Δ_r = θ - θ_r                        (the pseudo-gradient, as DiLoCo's outer gradient)
    e_r <- β e_r + Δ_r                   (error feedback with decay β: the local stand-in for
                                          DiLoCo's outer momentum)
    Δ̂_r = Q(TopK_chunk(e_r))            (k of every chunk of C; Q: 2-bit-class values)
    e_r <- e_r - Δ̂_r
    θ   <- θ - α (1/R) Σ_r Δ̂_r          (the sparse messages all-gathered and averaged)

The message is gradwire's ``chunked-topk`` codec (``compress/chunked.py``: quantised values, then
Golomb-coded positions), all-gathered through the averager as any non-summable payload, so the ledger
counts its exact bytes; the all-gather's bytes grow with the replicas. Everything else is
DiLoCo's (``diloco.py``): the replicas and their AdamW, the pace of workers under stragglers, the
collective (``Averager.start_payloads``), the outer step (SGD at rate α without momentum, which is θ - αΔ),
the checkpoint of θ and the replicas, to which the accumulators e_r are added.

``aggregate=senders_mean`` and ``clip=median_norm`` replace the last line's (1/R) Σ with the rule of
the authors' trainer (each position averaged over the workers that sent it, each message's norm per
parameter tensor first cut to the workers' median: ``averaging/combine.py``); the messages, their
bytes and the error feedback stay Algorithm 1's.
"""

from __future__ import annotations

import torch

from gradwire.algorithms.base import ALGORITHMS
from gradwire.algorithms.diloco import DILOCO_PARAMS, DiLoCo
from gradwire.averaging.combine import AGGREGATES, CLIPS, MessageCombine
from gradwire.compress.chunked import VALUE_CODES
from gradwire.spec import require

SPARSELOCO_PARAMS = {
    "inner_steps": "H >= 1: inner AdamW steps per outer round",
    "outer_lr": "α > 0: outer step θ <- θ - α mean(Δ̂) (Algorithm 1; 1 is the plain sparse average)",
    "decay": "β in [0, 1]: error-feedback decay e <- β e + Δ",
    "chunk": "C: elements per top-k chunk",
    "k": "elements sent per chunk, 1..C (the paper: 1-3 % density; 128 of 4096 = 3.1 %; the default: docs/defaults.md)",
    "values": f"kept values: {' or '.join(VALUE_CODES)} (ternary: 1.6 bits each + a float32 scale per block)",
    "block": "with values=ternary: kept values per float32 scale",
    "aggregate": f"{' or '.join(AGGREGATES)}: mean = (1/R) Σ of the messages (Algorithm 1); senders_mean = each "
                 "position averaged over the workers that sent it (the authors' trainer; averaging/combine.py)",
    "clip": f"{' or '.join(CLIPS)}: median_norm = each message's norm per parameter tensor cut to the workers' "
            "median before aggregating (the authors' trainer); none = Algorithm 1",
} | {key: DILOCO_PARAMS[key] for key in ("inner", "beta1", "beta2", "eps", "weight_decay")}


class SparseLoCo(DiLoCo):
    name = "sparseloco"
    # the inner AdamW's --lr when not given (docs/defaults.md): three times DiLoCo's, perhaps because its outer
    # step (α = 1, no momentum) does not amplify the inner change as DiLoCo's Nesterov step does; 0.02 until the
    # tenth round, where 0.03 learned 1.1 points more on 30 held-out runs and 3.8 more on the CNN
    default_lr = 3e-2

    def __init__(self, *, inner_steps: int = 5, outer_lr: float = 1.0, decay: float = 0.95, chunk: int = 4096,
                 k: int = 128, values: str = "ternary", block: int = 64, inner: str = "adamw", beta1: float = 0.9,
                 beta2: float = 0.95, eps: float = 1e-8, weight_decay: float = 0.1, aggregate: str = "mean",
                 clip: str = "none"):
        super().__init__(inner_steps=inner_steps, outer_lr=outer_lr, outer_momentum=0.0, inner=inner, beta1=beta1,
                         beta2=beta2, eps=eps, weight_decay=weight_decay)
        require(0 <= decay <= 1, f"decay must be in [0, 1] (the error-feedback decay β), got {decay}")
        require(chunk >= 1 and 1 <= k <= chunk, f"need chunk >= 1 and k in [1, chunk]; got chunk={chunk}, k={k}")
        require(values in VALUE_CODES, f"values={values!r}: valid choices are {', '.join(VALUE_CODES)}")
        self.decay = decay
        require(aggregate in AGGREGATES, f"aggregate={aggregate!r}: valid choices are {', '.join(AGGREGATES)}")
        require(clip in CLIPS, f"clip={clip!r}: valid choices are {', '.join(CLIPS)}")
        self.aggregate, self.clip = aggregate, clip
        # the message's codec: make_averager(default=...) builds it when --compressor is none (setup refuses another)
        self.default_compressor = f"chunked-topk:chunk={chunk},k={k},values={values},block={block}"

    def setup(self, ctx, params, optim, codec):
        require(codec.compressor == "none" and not codec.error_feedback,
                f"{self.name} compresses with its own chunked top-k and error feedback (spec keys chunk, k, "
                f"values, decay): --compressor and --error-feedback do not apply")
        super().setup(ctx, params, optim, codec)
        if (self.aggregate, self.clip) != ("mean", "none"):  # the receiving end's rule; the wire is unchanged
            self.averager.combine_by(MessageCombine(aggregate=self.aggregate, clip=self.clip,
                                                    segments=[s.numel() for s in ctx.param_shapes]))
        # its error-feedback memory, kept where the outer state is (--outer-state: host memory or the device)
        self.accumulators = {r: torch.zeros_like(self.theta) for r in ctx.local_ranks}

    def _start(self, ctx, p: int, step: int) -> None:
        """Sarfi et al. 2025, Algorithm 1: e_r <- β e_r + Δ_r, Δ̂_r = Q(TopK(e_r)), e_r <- e_r - Δ̂_r;
        the payloads of Δ̂_r start their all-gather."""
        a, b = self.ranges[p]
        for r, x in self.replicas.x.items():
            self.accumulators[r][a:b].mul_(self.decay).add_(self.theta[a:b] - x[a:b].to(self.theta.device))
        payloads = self.averager.payloads({r: e[a:b] for r, e in self.accumulators.items()}, key=f"fragment{p}")
        for r, e in self.accumulators.items():
            e[a:b].sub_(self.averager.decode_payload(payloads[r], e[a:b]))
        self.in_flight[p] = {"started_at": step, "payloads": payloads}
        self._start_collective(ctx, p)

    def per_worker_state(self) -> tuple[str, ...]:
        return super().per_worker_state() + ("accumulators",)

    def state_dict(self):
        return super().state_dict() | {"accumulators": {str(r): e for r, e in self.accumulators.items()}}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        for r, e in self.accumulators.items():
            e.copy_(state["accumulators"][str(r)])


ALGORITHMS.register("sparseloco", help="SparseLoCo (Sarfi 2025): DiLoCo with per-replica error feedback for outer "
                    "momentum, chunked top-k of ternary values all-gathered", params=SPARSELOCO_PARAMS)(SparseLoCo)
