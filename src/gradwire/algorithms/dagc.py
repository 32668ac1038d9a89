"""DAGC: data-aware adaptive gradient compression (Lu, Song, Chen, Cui, Wang 2023, "DAGC: Data-aware
adaptive gradient compression", IEEE INFOCOM; extended as Lu et al. 2023, arXiv:2311.07324).

Worker i holds a share p_i = n_i/n of the samples. Instead of one top-k ratio for everybody, DAGC
gives workers with more data a gentler compression under the same total budget.

Why p^(2/3). The aggregate is Σ_i p_i C(g_i) (FedAvg weighting). With error feedback, a δ-contraction
(top-k with ratio δ = k/d) adds a term of order (1-δ)/δ² to the convergence bound (Karimireddy,
Rebjock, Stich, Jaggi 2019, "Error feedback fixes SignSGD", Theorem II); worker i's error enters the
aggregate scaled by p_i, so for small ratios the compression term is about Σ_i p_i²/δ_i². Minimising
it subject to the budget Σ_i δ_i = N·r (Lagrange: 2 p_i²/δ_i³ = λ) gives δ_i ∝ p_i^(2/3), the
allocation of the paper's relative scheme (DAGC-R). A ratio cannot exceed 1: capped workers' excess
is shared by the others in proportion to p_i^(2/3) (water-filling, see ``budgeted_counts``).

Budget, exactly: ``budget=r`` keeps K = N·ceil(r·d) elements per step in total, the count that
uniform ``topk:ratio=r`` sends from N workers; k_i are integers in [1, d] with Σ k_i = K, each the
rounded water-filling solution (largest remainder). The values then cost what uniform top-k's do;
the Golomb-coded positions (compress/gapcode.py) cost about log2 C(d, k_i) bits, concave in k_i,
so the uneven allocation sends slightly fewer position bytes than uniform top-k (0.4% fewer bytes
in all in tests/algorithms/test_dagc_run.py). Payload sizes depend on the data: no fixed size is
announced to the allgather.

``mode=absolute`` (DAGC-A): a hard threshold per worker, τ_i = τ0·(N p_i)^(-2/3), so a worker with
more data keeps more. τ0 is ``tau`` if given, else calibrated at set-up from one gradient per worker
at the initial parameters: worker i finds the τ that would keep exactly its relative-mode k_i, and
τ0 is the geometric mean over workers of τ·(N p_i)^(2/3) (one 16-byte allreduce). The kept count, and
so the bytes, then follow the gradients: it is a budget on the first step only. ``mode=uniform`` is
the same algorithm with equal k_i: the ablation that isolates the allocation.

``local_steps=K`` > 1: FedAvg-style rounds. Each worker runs K plain SGD steps from the global
model and sends C((x - x_i)/γ), its model delta in gradient units (so thresholds mean the same for
every K); the server applies the p-weighted aggregate with the heavy-ball update (momentum 0 and
K > 1 is FedAvg with server step 1; momentum > 0 is FedAvgM, Hsu, Qi, Brown 2019).
"""

from __future__ import annotations

import math
from types import MappingProxyType

import numpy as np
import torch

from gradwire.algorithms.adaptive import budgeted_counts, data_shares, weighted_gather
from gradwire.algorithms.base import ALGORITHMS, Algorithm
from gradwire.algorithms.optim import make_optimizer, require_constant_lr
from gradwire.compress import ErrorFeedback, Packet
from gradwire.compress.positions import keep_count
from gradwire.compress.sparse import KeepTopK, Threshold, top_indices
from gradwire.spec import require

MODES = ("relative", "absolute", "uniform")


@ALGORITHMS.register(
    "dagc", help="DAGC (Lu 2023): per-worker top-k ratios ∝ p_i^(2/3) of data share under a total budget",
    params={"budget": "mean kept ratio r in (0, 1]: N·ceil(r·d) elements per step in total (the default: "
                      "docs/defaults.md)",
            "mode": "relative (top-k counts), absolute (thresholds ∝ p_i^(-2/3)) or uniform (equal k)",
            "local_steps": "local SGD steps per round K (a --steps step is one round); K > 1 sends compressed model "
                           "deltas (FedAvg)",
            "tau": "absolute mode: threshold of a worker with share 1/N (0 = calibrate at set-up)"})
class DAGC(Algorithm):
    name = "dagc"
    default_lr = 0.8  # --lr when not given (docs/defaults.md, with the default budget 0.1)
    # on the default task its own step, not 0.8 x the task's 2: 2.0 learned 3 points more there on ten held-out seeds
    # (docs/defaults.md, tenth round); the CNN keeps 0.8 x 0.75 (1.0 there ended at chance)
    default_lr_on_task = MappingProxyType({"mnist1d-mlp": 2.0})

    def __init__(self, *, budget: float = 0.1, mode: str = "relative", local_steps: int = 1,
                 tau: float = 0.0):
        require(0 < budget <= 1, f"budget must be in (0, 1] (the mean fraction of elements kept), "
                f"got {budget}")
        require(mode in MODES, f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        require(local_steps >= 1, f"local_steps must be >= 1, got {local_steps}")
        require(math.isfinite(tau) and tau >= 0, f"tau must be a finite number >= 0, got {tau}")
        require(tau == 0 or mode == "absolute", "tau applies to mode=absolute only")
        self.budget, self.mode, self.local_steps, self.tau = budget, mode, local_steps, tau

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require(codec.compressor == "none", f"dagc chooses its own compressors; drop --compressor "
                f"{codec.compressor!r} (use --algorithm dagc:budget=..., or sync with --compressor)")
        self.d, self.world = params.numel(), ctx.world_size
        self.shares = data_shares(ctx.shard_sizes, ctx.world_size, "dagc")
        self.total_keep = ctx.world_size * keep_count(self.budget, self.d)
        weights = np.ones(self.world) if self.mode == "uniform" else self.shares ** (2 / 3)
        self.keep = budgeted_counts(weights, self.total_keep, 1, self.d)
        self.x = params.clone()
        if self.local_steps > 1:
            require_constant_lr(optim, f"dagc with local_steps={self.local_steps} (its workers' local steps use --lr "
                                "as it is)")
        self.opt = make_optimizer(self.x, optim)
        self.thresholds = torch.zeros(self.world, dtype=torch.float64)
        if self.mode == "absolute":
            self.thresholds = self._calibrate(ctx) if self.tau == 0 else self._spread(self.tau)
            self.compressors = {r: Threshold(tau=float(self.thresholds[r])) for r in range(self.world)}
        else:
            self.compressors = {r: KeepTopK(k=int(self.keep[r])) for r in range(self.world)}
        self.ef = ({r: ErrorFeedback(self.compressors[r]) for r in ctx.local_ranks}
                   if codec.error_feedback else None)
        sizes = {c.nbytes(self.d, params.dtype) for c in self.compressors.values()}
        self.size = sizes.pop() if len(sizes) == 1 else None  # None: data-dependent (both compressors)

    def _spread(self, tau0: float) -> torch.Tensor:
        """τ_i = τ0·(N p_i)^(-2/3): τ0 for a worker with the mean share."""
        return torch.from_numpy(tau0 * (self.world * self.shares) ** (-2 / 3))

    def _calibrate(self, ctx) -> torch.Tensor:
        """τ0 such that, at the initial parameters, worker i would keep about its DAGC-R count k_i:
        the geometric mean of the per-worker τ0 that keeps exactly k_i (one gradient each, one
        16-byte allreduce; a geometric mean because thresholds spread over orders of magnitude).
        A worker whose k-th largest |g| is 0 (more zeros than d - k) says nothing of the scale and is
        left out of the mean (a floor of 1e-30 there had pulled every threshold to ~1e-15, so that
        every worker sent everything; its smallest non-zero |g| instead still kept 97 % elsewhere)."""
        logs = {}
        for r in ctx.local_ranks:
            _, g = ctx.gradient(r, self.x)
            k = int(self.keep[r])
            t = float(g.abs()[top_indices(g, k)].min()) if k else 0.0  # k-th largest |g|
            if t > 0.0:  # (log τ0_i, 1): summed over the informative workers, and their count
                scale = t * (self.world * self.shares[r]) ** (2 / 3)
                logs[r] = torch.tensor([math.log(scale), 1.0], dtype=torch.float64)
            else:
                logs[r] = torch.zeros(2, dtype=torch.float64)
        mean_log, informative = (float(v) for v in ctx.transport.allreduce_mean(logs))
        # (τ0 = 0 would keep every element, zeros too, for the whole run: calibration happens once)
        require(informative > 0, "mode=absolute: no worker's initial gradient has its k_i-th largest |g| above 0, so "
                "there is no scale to calibrate from; give tau= (the threshold of a worker with the mean share)")
        tau0 = math.exp(mean_log / informative)
        return self._spread(tau0)

    def _update(self, ctx, rank: int) -> tuple[float, torch.Tensor]:
        """Mean minibatch loss and the message: the gradient, or the model delta / γ after K steps."""
        if self.local_steps == 1:
            return ctx.gradient(rank, self.x)
        local, losses = self.x.clone(), []
        for _ in range(self.local_steps):
            loss, g = ctx.gradient(rank, local)
            local.sub_(g, alpha=self.optim.lr)
            losses.append(loss)
        return sum(losses) / len(losses), self.x.sub(local).div_(self.optim.lr)

    def _decode(self, rank: int, buffer: torch.Tensor) -> torch.Tensor:
        return self.compressors[rank].decode(Packet(buffer, self.x.shape, self.x.dtype))

    def step(self, ctx, step):
        k0 = (step - 1) * self.local_steps  # the round's compute: K local steps of every worker
        times = sum(ctx.compute_times(k0 + j) for j in range(1, self.local_steps + 1))
        ctx.compute_for(times)
        losses, buffers = {}, {}
        for r in ctx.local_ranks:
            losses[r], u = self._update(ctx, r)
            packet = (self.ef[r].encode(u, key="update") if self.ef is not None
                      else self.compressors[r].encode(u))
            buffers[r] = packet.buffer
        agg, gathered = weighted_gather(ctx, buffers, self._decode, self.shares, self.x, self.size)
        self.opt.apply(agg)
        kept = sum(self._kept(r, b) for r, b in gathered.items())
        return {"loss": sum(losses.values()) / len(losses), "gradients": self.world * self.local_steps,
                "kept": kept, "kept_fraction": kept / (self.world * self.d)}

    def _kept(self, rank: int, buffer: torch.Tensor) -> int:
        """Elements in a message: k_i, or the uint32 count header of a threshold payload."""
        if self.mode != "absolute":
            return int(self.keep[rank])
        return int.from_bytes(bytes(buffer[:4].tolist()), "little")

    def setup_info(self):
        info = {"mode": self.mode, "budget": self.budget, "local_steps": self.local_steps,
                "parameters": self.d, "total_keep": int(self.total_keep),
                "shares": [round(float(p), 6) for p in self.shares],
                "ratios": [round(int(k) / self.d, 6) for k in self.keep],
                "keep": [int(k) for k in self.keep]}
        if self.mode == "absolute":
            info["thresholds"] = [float(f"{float(t):.6g}") for t in self.thresholds]
            info["note"] = "ratios and keep are the first-step targets the thresholds were calibrated to"
        return info

    def eval_params(self):
        return self.x

    def compressor_spec(self):  # one count (or threshold) per worker: algorithm.json lists them
        return f"{next(iter(self.compressors.values())).name} (per worker)"

    def spec(self):  # not spec_of: tau only when set, floats as repr (as in earlier run records)
        tau = f",tau={self.tau!r}" if self.tau else ""
        return f"dagc:budget={self.budget!r},mode={self.mode},local_steps={self.local_steps}{tau}"

    def per_worker_state(self) -> tuple[str, ...]:
        return ("error_feedback",) if self.ef is not None else ()

    def state_dict(self):
        state = {"x": self.x, "opt": self.opt.state_dict(), "thresholds": self.thresholds}
        if self.ef is not None:
            state["error_feedback"] = {str(r): ef.state_dict() for r, ef in self.ef.items()}
        return state

    def load_state_dict(self, state):
        self.x.copy_(state["x"])
        self.opt.load_state_dict(state["opt"])
        if self.mode == "absolute":
            self.thresholds = state["thresholds"].clone()
            self.compressors = {r: Threshold(tau=float(self.thresholds[r])) for r in range(self.world)}
            if self.ef is not None:
                for r, ef in self.ef.items():
                    ef.compressor = self.compressors[r]
        if self.ef is not None:
            for r, ef in self.ef.items():
                ef.load_state_dict(state["error_feedback"][str(r)])
