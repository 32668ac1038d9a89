"""signSGD with majority vote (Bernstein, Zhao, Azizzadenesheli, Anandkumar 2019, arXiv:1810.05291,
Algorithm 1 with the momentum of Signum, Bernstein, Wang, Azizzadenesheli, Anandkumar 2018,
arXiv:1802.04434, Algorithm 3) on the simulator: the run against a reference written from the
papers' update on the same minibatch gradients, under a constant and a decaying learning rate, the
same for rank 0's error-fed reply (down=ef: the votes' mean plus a residual, sent as a scaled sign;
the server side of Tang et al. 2019's DoubleSqueeze), and checkpoints that resume bitwise (the
schedule's update count and rank 0's residual included)."""

import math

import numpy as np
import pytest

from gradwire.run.loop import Run
from tests.helpers import record_gradients, resume_matches


@pytest.mark.parametrize(("spec", "beta", "down", "schedule", "weight_decay"), [
    ("signsgd:momentum=0,down=vote", 0.0, "vote", "constant", 0.0),       # plain signSGD, majority vote
    ("signsgd:momentum=0.9,down=vote", 0.9, "vote", "linear", 0.0),       # Signum, the rate decayed linearly to 0
    ("signsgd:momentum=0.5,down=vote", 0.5, "vote", "cosine:warmup=2,min_ratio=0.1", 0.05),
    ("signsgd", 0.8, "ef", "constant", 0.0),                              # the documented defaults: β, the reply
    ("signsgd:momentum=0.3,down=vote", 0.3, "vote", "constant", 0.02),
    ("signsgd:momentum=0", 0.0, "ef", "linear", 0.0),
    ("signsgd:momentum=0.5,down=ef", 0.5, "ef", "cosine:warmup=2,min_ratio=0.1", 0.05),
])
def test_steps_match_the_papers_update(make_config, spec, beta, down, schedule, weight_decay):
    """m_i <- β m_i + (1 - β) g_i (m_i = g_i when β = 0); with down=vote, reply = sign(Σ_i sign(m_i))
    (a tie votes +1, and sign(0) is +1: the 1-bit code has no zero, and digits' blank pixels give exact
    zeros); with down=ef, u = e + Σ_i sign(m_i) / n, reply = s·sign(u) with s = mean |u| as the float32
    of the wire, e <- u - reply; x <- x - γ_k (reply + λ x), γ_k = --lr times the schedule's factor of
    update k. β and the reply are the spec's, written as literals (not read back from the algorithm)."""
    steps, lr = 9, 0.01
    r = Run(make_config(algorithm=spec, dtype="float64", lr=lr, workers=4, steps=steps, lr_schedule=schedule,
                        weight_decay=weight_decay))
    alg = r.algorithm
    grads = record_gradients(r)
    x = alg.x.numpy().copy()
    m = {k: np.zeros_like(x) for k in range(4)}
    rate = [lr * f for f in _factors(schedule, steps)]
    assert (rate[0] != rate[-1]) == (schedule != "constant")
    ties, e = 0, np.zeros_like(x)
    for k in range(steps):
        r.train_step()
        signs = []
        for i in range(4):
            m[i] = beta * m[i] + (1 - beta) * grads[i].numpy()
            signs.append(np.where(m[i] >= 0, 1.0, -1.0))
        total = sum(signs)
        ties += int((total == 0).sum())
        if down == "vote":
            vote = np.where(total >= 0, 1.0, -1.0)
        else:
            u = e + total / 4
            vote = float(np.float32(np.abs(u).mean())) * np.where(u >= 0, 1.0, -1.0)
            e = u - vote
            assert np.abs(e).max() > 0  # the reply left a remainder somewhere, kept for the next step
        x = x - rate[k] * (vote + weight_decay * x)
        np.testing.assert_allclose(alg.x.numpy(), x, rtol=0, atol=1e-12, err_msg=f"x after update {k}")
    assert ties > 0  # four workers tie somewhere, and the tie rule was exercised
    assert alg.updates == steps


def _factors(schedule: str, steps: int) -> list[float]:
    """The factor of update k (0-based) of ``steps``, written from the schedules' definitions
    (docs: linear warm-up (k + 1)/W for k < W, then floor + (1 - floor) d(p), p = (k - W)/(T - W);
    d(p) = 1 - p for linear, (1 + cos π p)/2 for cosine), for the three schedules used here."""
    if schedule == "constant":
        return [1.0] * steps
    if schedule == "linear":  # no warm-up, floor 0
        return [1 - k / steps for k in range(steps)]
    assert schedule == "cosine:warmup=2,min_ratio=0.1"
    return [(k + 1) / 2 if k < 2 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (k - 2) / (steps - 2)))
            for k in range(steps)]


@pytest.mark.parametrize(("spec", "schedule"), [("signsgd:momentum=0.9", "constant"), ("signsgd", "linear:warmup=3"),
                                              ("signsgd:down=vote", "linear:warmup=3")])
def test_resume_continues_the_rate_the_momentum_and_the_residual(make_config, spec, schedule):
    resume_matches(make_config(algorithm=spec, lr=0.01, steps=10, lr_schedule=schedule), 4, 6)


def test_the_residual_is_in_the_checkpoint_and_a_checkpoint_of_the_vote_is_refused_in_one_line(make_config):
    from gradwire.errors import ConfigError

    ef = Run(make_config(algorithm="signsgd", lr=0.01, steps=4, workers=4))
    for _ in range(3):
        ef.train_step()
    state = ef.algorithm.state_dict()
    assert state["residual"].abs().sum() > 0  # the reply left a remainder, kept for the next step
    vote = Run(make_config(algorithm="signsgd:down=vote", lr=0.01, steps=4, workers=4))
    assert "residual" not in vote.algorithm.state_dict()
    with pytest.raises(ConfigError, match=r"before down=ef was the default \(signsgd then meant down=vote,momentum=0"):
        ef.algorithm.load_state_dict(vote.algorithm.state_dict())


def test_an_unknown_reply_is_refused_in_one_line_naming_the_choices():
    from gradwire.algorithms import ALGORITHMS
    from gradwire.errors import ConfigError

    line = r"^algorithm spec 'signsgd:down=majority': down='majority': valid choices are ef, vote$"
    with pytest.raises(ConfigError, match=line):
        ALGORITHMS.build("signsgd:down=majority")
