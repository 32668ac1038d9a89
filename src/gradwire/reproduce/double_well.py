"""The "curse of symmetry" on a two-dimensional double well (Teng et al. 2019, Sec. 3, the picture
the LSGD paper draws against EASGD).

f(x) = (x₁² - 1)² + x₂² has two minima (±1, 0) and a saddle at the symmetric point (0, 0). Half of
the workers start just right of the saddle and half just left of it, each minibatch adding noise.
EASGD's center is the (elastic) average of the workers: with the workers split between the wells
it sits at the symmetric point and stays there. LSGD pulls every worker towards the best one, so all
of them end in the leader's well.

    python -m gradwire.reproduce.double_well docs/img/lsgd_double_well.png   # redraw the docs figure

``gradwire reproduce --only lsgd-symmetry`` runs it over several seeds and judges the claim
(``reproduce/lsgd_symmetry.py``); ``tests/algorithms/test_leader_sgd.py`` asserts on it.
"""

from __future__ import annotations

import sys

import torch

from gradwire.algorithms import ALGORITHMS, CodecConfig, Context, OptimConfig
from gradwire.seeding import hash_seed
from gradwire.transports.network import NETWORKS
from gradwire.transports.sim import SimClock, SimTransport
from gradwire.transports.stragglers import STRAGGLERS

WORKERS, START = 8, 0.15  # workers, |x₁| of the starting points on either side of the saddle


def f(x: torch.Tensor) -> float:
    return float((x[0] ** 2 - 1) ** 2 + x[1] ** 2)


class DoubleWell:
    """A worker's minibatch: f plus a linear noise term ξ·x, ξ ~ N(0, noise²) per worker and call."""

    def __init__(self, noise: float, seed: int):
        self.noise = noise
        self.gen = {r: torch.Generator().manual_seed(hash_seed(seed, "double-well", r)) for r in range(WORKERS)}

    def __call__(self, rank, x):
        xi = self.noise * torch.randn(2, generator=self.gen[rank], dtype=x.dtype)
        grad = torch.stack([4 * x[0] * (x[0] ** 2 - 1), 2 * x[1]]) + xi
        return f(x) + float(xi @ x), grad


def simulate(spec: str, *, steps: int = 300, lr: float = 0.05, noise: float = 0.5, seed: int = 0):
    """Train ``spec`` on the double well; returns (algorithm, trajectories: step -> {rank: x})."""
    clock = SimClock()
    transport = SimTransport(WORKERS, NETWORKS.build("ps"), clock)
    ctx = Context(world_size=WORKERS, local_ranks=transport.local_ranks, transport=transport,
                  oracle=DoubleWell(noise, seed), stragglers=STRAGGLERS.build("none"), clock=clock, seed=seed)
    alg = ALGORITHMS.build(spec)
    alg.setup(ctx, torch.tensor([0.0, 0.8], dtype=torch.float64), OptimConfig(lr=lr), CodecConfig())
    for r, x in alg.replicas.x.items():  # half of the workers on either side of the saddle
        x[0] = START if r % 2 == 0 else -START
    if hasattr(alg, "center"):
        alg.center[0] = 0.0  # the center starts as the workers' mean
    path = [{r: x.clone() for r, x in alg.replicas.x.items()} | {"eval": alg.eval_params().clone()}]
    for t in range(1, steps + 1):
        alg.step(ctx, t)
        alg.before_evaluation(ctx)  # evaluated at every step (LSGD's default: the workers' average)
        path.append({r: x.clone() for r, x in alg.replicas.x.items()} | {"eval": alg.eval_params().clone()})
    return alg, path


def plot(out: str, lsgd_spec: str, easgd_spec: str, seed: int = 0, runs: dict | None = None) -> None:
    """Both algorithms' trajectories side by side; ``runs``: spec -> ``simulate(spec, seed=seed)``
    already computed (simulated here otherwise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g1, g2 = torch.meshgrid(torch.linspace(-1.6, 1.6, 200), torch.linspace(-1.0, 1.0, 120), indexing="xy")
    z = (g1**2 - 1) ** 2 + g2**2
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, spec in ((axes[0], easgd_spec), (axes[1], lsgd_spec)):
        alg, path = (runs or {}).get(spec) or simulate(spec, seed=seed)
        label = alg.evaluates
        ax.contour(g1, g2, z, levels=[0.02, 0.1, 0.3, 0.6, 1.0, 1.5, 2.5], colors="0.75", linewidths=0.8)
        for r in range(WORKERS):
            pts = torch.stack([p[r] for p in path])
            ax.plot(pts[:, 0], pts[:, 1], color="tab:blue", alpha=0.45, lw=0.8)
            ax.plot(*pts[-1], "o", color="tab:blue", ms=4)
        ev = torch.stack([p["eval"] for p in path])
        ax.plot(ev[:, 0], ev[:, 1], color="tab:red", lw=1.6, label=f"{label} (evaluated)")
        ax.plot(*ev[-1], "*", color="tab:red", ms=13)
        ax.set_title(f"{spec}: final {label} f = {f(ev[-1]):.3f}")
        ax.set_xlabel("x₁")
        ax.legend(loc="upper right", fontsize=8)
    axes[0].set_ylabel("x₂")
    fig.suptitle("f(x) = (x₁² - 1)² + x₂², 8 workers started on both sides of the saddle (blue: workers)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


LSGD_SPEC, EASGD_SPEC = "lsgd:pull=0.5,period=2", "easgd:beta=0.9,period=2"

if __name__ == "__main__":
    plot(sys.argv[1] if len(sys.argv) > 1 else "lsgd_double_well.png", LSGD_SPEC, EASGD_SPEC)
