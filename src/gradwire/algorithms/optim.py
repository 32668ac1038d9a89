"""The update rules shared by the gradient-averaging algorithms, chosen by ``--optimizer``.

Heavy-ball SGD, as torch.optim.SGD without dampening: v <- β v + (g + wd·x); x <- x - γ v; with
``nesterov`` the step is x <- x - γ (g + wd·x + β v), Nesterov momentum in the form torch.optim
uses (Sutskever, Martens, Dahl, Hinton 2013, "On the importance of initialization and momentum in
deep learning", ICML, eqs. (3)-(4); the LSGD authors train with it, Teng et al. 2019). Then the
proximal step of the L1 term, x <- soft(x, γ·l1) (proximal SGD; Parikh & Boyd 2014, §4.2). Kept
here rather than in torch.optim so the prox is part of the same update and the whole state is one
tensor in the checkpoint.

``--lr-schedule`` (LR_SCHEDULES) scales --lr by update: update k of a rule uses --lr · f(k, --steps).
Every rule counts its own updates, so the rules that update once a step (sync's, each replica's in
local SGD and synchronous EASGD or LSGD, DiLoCo's inner AdamW) follow the schedule by step; the
replicas of the server-mode DiLoCos (backup-diloco, async-diloco) by the run's progress over --steps
× H inner updates (outer_replicas.PhaseRate). Algorithms with an update of their own, a server
applying every worker's gradient (async), and workers stepping at their own pace (asynchronous EASGD
and LSGD) refuse any schedule but constant.
"""

from __future__ import annotations

import math

import torch

from gradwire.algorithms.base import OptimConfig, soft_threshold_
from gradwire.errors import ConfigError
from gradwire.spec import Registry, parse_spec, require

OPTIMIZERS = Registry("optimizer")
LR_SCHEDULES = Registry("lr_schedule")


@LR_SCHEDULES.register("constant", help="the same --lr at every update")
class ConstantLR:
    warmup = 0

    def factor(self, update: int, total: int) -> float:
        return 1.0


class _WarmupDecay:
    """Linear warm-up, then a decay to ``min_ratio`` of --lr. Update k (0-based) of ``total`` steps
    uses --lr times f(k): f(k) = (k + 1) / W for k < W (warm-up W), so the W-th update is the first at
    the full rate; then f = min_ratio + (1 - min_ratio) d(p), p = (k - W) / (total - W) the fraction
    of the decay done (so the first decayed update is at the full rate and the last one close to
    min_ratio) and d falling from 1 at p = 0 to 0 at p = 1 (the subclass's shape). Updates past
    ``total`` stay at min_ratio. The indexing of HuggingFace's and torch's LambdaLR schedules: the
    k-th ``scheduler.step()`` sets the rate of update k."""

    def __init__(self, *, warmup: int = 0, min_ratio: float = 0.0):
        require(warmup >= 0, f"warmup must be an integer >= 0 (updates of linear warm-up), got {warmup}")
        require(math.isfinite(min_ratio) and 0 <= min_ratio <= 1,
                f"min_ratio must be in [0, 1] (the final rate as a fraction of --lr), got {min_ratio}")
        self.warmup, self.min_ratio = warmup, min_ratio

    def factor(self, update: int, total: int) -> float:
        if update < self.warmup:
            return (update + 1) / self.warmup
        progress = min(1.0, (update - self.warmup) / max(1, total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * self.decay(progress)

    def decay(self, progress: float) -> float:
        raise NotImplementedError


_SCHEDULE_PARAMS = {"warmup": "updates of linear warm-up from --lr/warmup to --lr (0: none)",
                    "min_ratio": "the rate the decay ends at, as a fraction of --lr (0.1 is common)"}


@LR_SCHEDULES.register("cosine", help="linear warm-up, then cosine decay to min_ratio·lr at the last step (SGDR "
                       "without restarts: Loshchilov & Hutter 2017, eq. (5); the DiLoCo papers' inner schedule)",
                       params=_SCHEDULE_PARAMS)
class CosineLR(_WarmupDecay):
    def decay(self, progress: float) -> float:
        return 0.5 * (1 + math.cos(math.pi * progress))


@LR_SCHEDULES.register("linear", help="linear warm-up, then linear decay to min_ratio·lr at the last step",
                       params=_SCHEDULE_PARAMS)
class LinearLR(_WarmupDecay):
    def decay(self, progress: float) -> float:
        return 1 - progress


def lr_schedule(spec: str, steps: int, per_step: int = 1):
    """The schedule ``spec`` names, for a run of ``steps`` of ``per_step`` updates each (the
    server-mode DiLoCos': H inner steps); ConfigError for a bad spec, or for a warm-up that would
    last the whole run."""
    rule = LR_SCHEDULES.build(spec)
    if rule.warmup >= steps * per_step:
        run = f"--steps {steps}" if per_step == 1 else f"{steps * per_step} inner steps (--steps {steps} × {per_step})"
        raise ConfigError(f"lr_schedule={spec!r} warms up over {rule.warmup} steps, but the run has only {run}: "
                          "lower warmup= (10 % of the steps is common)")
    return rule


def torch_lr_scheduler(optimizer: torch.optim.Optimizer, spec: str, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The same ``--lr-schedule`` for a torch.optim optimizer (a DDP script with ``gradwire.ddp``'s
    hook, say): a LambdaLR giving update k the factor ``f(k, steps)`` that gradwire's rules use; call
    its ``step()`` after each ``optimizer.step()``."""
    rule = lr_schedule(spec, steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: rule.factor(k, steps))


class ScheduledRate:
    """--lr times the schedule's factor, by update. The rule that holds it counts its own updates, and
    the count is part of its state, so a resumed run continues the schedule where it stopped."""

    def __init__(self, lr: float, schedule: str = "constant", horizon: int = 0):
        self.base, self.schedule, self.horizon = lr, LR_SCHEDULES.build(schedule), horizon
        self.constant = isinstance(self.schedule, ConstantLR)
        require(self.constant or horizon > 0, f"lr schedule {schedule!r} needs the number of steps it spans, got "
                f"{horizon}")

    def at(self, update: int) -> float:
        """The rate of update ``update`` (0-based): exactly --lr for the constant schedule."""
        return self.base if self.constant else self.base * self.schedule.factor(update, self.horizon)


class HeavyBall:
    def __init__(self, params: torch.Tensor, cfg: OptimConfig):
        self.x, self.cfg = params, cfg
        self.velocity = torch.zeros_like(params) if cfg.momentum else None
        self.rate = ScheduledRate(cfg.lr, cfg.lr_schedule, cfg.horizon)
        self.steps = 0

    def apply(self, grad: torch.Tensor) -> None:
        """Update the parameters in place with the aggregated gradient ``grad`` (not kept)."""
        cfg = self.cfg
        lr = self.rate.at(self.steps)
        self.steps += 1
        if cfg.weight_decay:
            grad = grad.add(self.x, alpha=cfg.weight_decay)
        if self.velocity is not None:
            velocity = self.velocity.mul_(cfg.momentum).add_(grad)
            grad = grad.add(velocity, alpha=cfg.momentum) if cfg.nesterov else velocity
        self.x.sub_(grad, alpha=lr)
        soft_threshold_(self.x, lr * cfg.l1)

    def state_dict(self) -> dict:
        state = {"steps": self.steps}
        return state if self.velocity is None else {**state, "velocity": self.velocity}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state.get("steps", 0))  # checkpoints from before the schedules have no count
        if self.velocity is not None:
            self.velocity.copy_(state["velocity"])


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019, "Decoupled weight decay
    regularization", ICLR, Algorithm 2; Adam: Kingma & Ba 2015, Algorithm 1), in the form
    torch.optim.AdamW uses, on one flat vector:

        x <- x (1 - γ λ);  m <- β1 m + (1 - β1) g;  v <- β2 v + (1 - β2) g²
        x <- x - γ m / (1 - β1^t) / (sqrt(v / (1 - β2^t)) + ε)

    then the proximal step of the task's L1 term, as HeavyBall. DiLoCo's inner optimizer
    (Douillard et al. 2023). The state (m, v and the step count t) is part of the checkpoint."""

    def __init__(self, params: torch.Tensor, *, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, l1: float = 0.0, lr_schedule: str = "constant", horizon: int = 0):
        self.x, self.betas, self.eps, self.weight_decay, self.l1 = params, betas, eps, weight_decay, l1
        self.rate = ScheduledRate(lr, lr_schedule, horizon)  # --lr, by update
        self.exp_avg = torch.zeros_like(params)
        self.exp_avg_sq = torch.zeros_like(params)
        self.steps = 0

    def apply(self, grad: torch.Tensor) -> None:
        """One AdamW step on the parameters in place with gradient ``grad`` (not kept)."""
        beta1, beta2 = self.betas
        lr = self.rate.at(self.steps)
        self.steps += 1
        if self.weight_decay:
            self.x.mul_(1 - lr * self.weight_decay)
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias1, bias2 = 1 - beta1 ** self.steps, 1 - beta2 ** self.steps
        # sqrt first, then the bias's square root (torch.optim.AdamW's order): v / bias2 overflowed float32
        # for |g| past ~1e19 (a step of 0 where torch's moves)
        denominator = (self.exp_avg_sq.sqrt() / math.sqrt(bias2)).add_(self.eps)
        self.x.addcdiv_(self.exp_avg, denominator, value=-lr / bias1)
        soft_threshold_(self.x, lr * self.l1)

    def state_dict(self) -> dict:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.steps = int(state["steps"])


@OPTIMIZERS.register("sgd", help="SGD with heavy-ball (or Nesterov) momentum: --lr, --momentum, --nesterov, "
                     "--weight-decay (added to the gradient, as torch.optim.SGD)")
class SGDRule:
    def make(self, x: torch.Tensor, optim: OptimConfig) -> HeavyBall:
        return HeavyBall(x, optim)


@OPTIMIZERS.register("adamw", help="AdamW on the averaged gradient (as torch.optim.AdamW): --lr, and --weight-decay as "
                     "its decoupled decay; --momentum must stay 0",
                     params={"beta1": "first-moment decay β1", "beta2": "second-moment decay β2 (0.95 is "
                             "common for language models)", "eps": "ε added to the denominator"})
class AdamWRule:
    def __init__(self, *, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        require(0 <= beta1 < 1, f"beta1={beta1} must be in [0, 1)")
        require(0 <= beta2 < 1, f"beta2={beta2} must be in [0, 1)")
        require(eps > 0, f"eps={eps} must be > 0")
        self.betas, self.eps = (beta1, beta2), eps

    def make(self, x: torch.Tensor, optim: OptimConfig) -> AdamW:
        return AdamW(x, lr=optim.lr, betas=self.betas, eps=self.eps, weight_decay=optim.weight_decay, l1=optim.l1,
                     lr_schedule=optim.lr_schedule, horizon=optim.horizon)


@OPTIMIZERS.register("muon", help="Muon (Jordan et al. 2024) on every weight matrix, AdamW on the other tensors, on "
                     "the averaged gradient: MuLoCo's inner rule (algorithms/muloco.py) as a data-parallel optimizer. "
                     "--lr is AdamW's and Muon's η is lr_ratio·--lr, both following --lr-schedule; --weight-decay "
                     "decays both; --momentum must stay 0 (Muon's is its own)",
                     params={"lr_ratio": "R > 0: Muon's η = R·--lr (R = 10 puts Muon's authors' η 0.02 at --lr 2e-3)",
                             "momentum": "Muon's momentum μ (Muon's authors: 0.95)",
                             "nesterov": "Muon's Nesterov form U = G + μ B (Muon's authors: true)",
                             "ns_steps": "K >= 1: Newton-Schulz iterations per update (Muon's authors: 5)",
                             "ns_coefficients": "jordan or polar-express (muloco's ns_coefficients)",
                             "matrices": "all (every 2-D tensor) or hidden (embeddings and the output layer on "
                             "AdamW: muloco's matrices)",
                             "beta1": "AdamW β1 of the non-matrix tensors", "beta2": "AdamW β2 of the non-matrix "
                             "tensors", "eps": "AdamW ε"})
class MuonRule:
    def __init__(self, *, lr_ratio: float = 10.0, momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 ns_coefficients: str = "jordan", matrices: str = "all", beta1: float = 0.9, beta2: float = 0.95,
                 eps: float = 1e-8):
        from gradwire.algorithms.muloco import MUON_MATRICES, ns_coefficients_of

        require(math.isfinite(lr_ratio) and lr_ratio > 0, f"lr_ratio={lr_ratio} must be a finite number > 0")
        require(0 <= momentum < 1, f"momentum={momentum} must be in [0, 1)")
        ns_coefficients_of(ns_coefficients, ns_steps)  # validates
        require(matrices in MUON_MATRICES, f"matrices must be one of {', '.join(MUON_MATRICES)}, got {matrices!r}")
        self.matrices = matrices
        AdamWRule(beta1=beta1, beta2=beta2, eps=eps)  # the same checks
        self.lr_ratio = lr_ratio
        self.settings = dict(momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, ns_coefficients=ns_coefficients,
                             betas=(beta1, beta2), eps=eps)

    def make(self, x: torch.Tensor, optim: OptimConfig):
        from gradwire.algorithms.muloco import muon_adamw, muon_matrices  # (muloco builds on this module)

        require(bool(optim.shapes), "--optimizer muon needs the model's tensor shapes (Muon works on its matrices)")
        rate = dict(lr=self.lr_ratio * optim.lr, lr_schedule=optim.lr_schedule, horizon=optim.horizon)
        return muon_adamw(optim.shapes, optim, muon_rate=rate, weight_decay=optim.weight_decay,
                          on_muon=muon_matrices(self.matrices, optim.shapes, optim.roles, "--optimizer muon"),
                          **self.settings)(x)


def make_optimizer(x: torch.Tensor, optim: OptimConfig) -> HeavyBall | AdamW:
    """The update rule ``optim.optimizer`` names, updating the flat vector ``x`` in place."""
    return OPTIMIZERS.build(optim.optimizer).make(x, optim)


def require_constant_lr(optim: OptimConfig, who: str) -> None:
    """For an algorithm that does not update through one rule once a step (its own update rule, or a
    server applying every worker's gradient): refuse a learning-rate schedule."""
    require(parse_spec(optim.lr_schedule)[0] == "constant",
            f"{who} does not follow --lr-schedule {optim.lr_schedule!r}; leave it at constant")


def require_sgd(optim: OptimConfig, who: str) -> None:
    """For an algorithm whose update is its own (DIANA, signSGD, DiLoCo): refuse ``--optimizer adamw``."""
    require(parse_spec(optim.optimizer)[0] == "sgd",
            f"{who} applies its own update rule, so --optimizer {optim.optimizer!r} does not apply to it; "
            "leave --optimizer at sgd")
