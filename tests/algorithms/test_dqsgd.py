"""DQ-SGD: the variance the rule uses is QSGD's, the chosen levels respect the bound with the fewest
bits, the bit budget is met, the header travels and is counted, and the state resumes exactly."""

import json

import numpy as np
import pytest
import torch

from gradwire.algorithms import ALGORITHMS
from gradwire.algorithms.dqsgd import CANDIDATES, choose_levels, rounding_variance
from gradwire.compress import CorruptPayload, Packet
from gradwire.compress.levels import bucket_norms, wire_scales
from gradwire.compress.qsgd import QSGD
from gradwire.errors import ConfigError
from gradwire.run.loop import Run, run
from tests.helpers import ADAPTIVE, read_jsonl, resume_matches


def scales_of(x, bucket):
    return wire_scales(x, bucket_norms(x, bucket, 2, torch.float32), bucket, 2, "test")


@pytest.mark.parametrize("levels", [1, 3, 7, 31])
def test_rounding_variance_is_the_encoders_mean_squared_error(levels):
    g = torch.Generator().manual_seed(levels)
    x = torch.randn(1000, generator=g) * torch.rand(1000, generator=g)  # uneven magnitudes, partial bucket
    q = QSGD(levels=levels, bucket=128)
    errors = [float((q.decode(q.encode(x, generator=g)) - x).double().square().sum()) for _ in range(400)]
    predicted = rounding_variance(x, scales_of(x, 128), 128, levels)
    assert np.mean(errors) == pytest.approx(predicted, rel=0.1)  # 400 draws: sampling error ~5%
    assert predicted <= q.omega(1000) * float(x.double().square().sum())  # Lemma 3.1's bound holds


def test_choose_levels_fewest_bits_within_the_limit():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        x = torch.randn(3000, generator=g) ** 3
        norm2 = float(x.double().square().sum())
        limit = norm2 * 10 ** float(torch.empty(1).uniform_(-4, 1, generator=g))
        s, v = choose_levels(x, 256, limit)
        var = {c: rounding_variance(x, scales_of(x, 256), 256, c) for c in CANDIDATES}
        assert v == var[s]
        if v <= limit:
            assert all(var[c] > limit for c in CANDIDATES if c < s)  # no cheaper choice meets it
        else:
            assert s == 127  # the bound cannot be met: finest grid
    assert choose_levels(x, 256, 0.0)[0] == 127


def test_levels_respect_the_bound_in_a_run(make_config):
    """Every step: p_i² V_i(s_i) <= ε R / N for each worker with the fewest bits, hence
    Q = Σ_i p_i² V_i <= ε R; the step figures report Q and ε R. R is recomputed here from what the
    workers sent (the docstring's rule): ĝ = Σ_i p_i Q_i(g_i) decoded from the payloads, Q the sum of
    their headers, R_1 = max(||ĝ||² - Q, 0) after the first step, then R <- 0.9 R + 0.1 max(||ĝ||² - Q, 0);
    before any aggregate each worker uses its own ||g_i||²."""
    eps = 0.3
    r = Run(make_config(ADAPTIVE, algorithm=f"dqsgd:error_bound={eps}", steps=15))
    seen, sent = {}, []
    oracle, allgather = r.ctx.oracle, r.ctx.transport.allgather
    r.ctx.oracle = lambda rank, x: seen.__setitem__(rank, oracle(rank, x)) or seen[rank]

    def recording(buffers, *args, **kwargs):
        out = allgather(buffers, *args, **kwargs)
        sent.append({k: b.clone() for k, b in out.items()})
        return out

    r.ctx.transport.allgather = recording
    shares, n = np.array(r.shard_sizes) / sum(r.shard_sizes), r.cfg.workers
    ref, signals = None, []
    for _ in range(15):
        info = r.train_step()
        payloads = sent.pop()
        total = 0.0
        for k, s in enumerate(info["levels"]):
            g = seen[k][1]
            limit = eps * (ref if ref is not None else float(g.double().square().sum())) / n
            var = {c: shares[k] ** 2 * rounding_variance(g, scales_of(g, 512), 512, c) for c in CANDIDATES}
            assert var[s] <= limit or s == 127
            assert all(var[c] > limit for c in CANDIDATES if c < s)
            assert int(payloads[k][0]) == s
            total += var[s]
        headers = [float(payloads[k][1:5].clone().view(torch.float32)) for k in range(n)]
        assert sum(headers) == pytest.approx(total, rel=1e-6)  # each header: p_i² V_i(s_i), as float32
        assert info["quant_variance"] == pytest.approx(total, rel=1e-6)
        assert info["error_bound"] == eps
        if ref is None:
            assert info["bound"] is None
        else:
            assert info["bound"] == pytest.approx(eps * ref, rel=1e-5)  # float32 aggregate in the run
            assert info["quant_variance"] <= info["bound"] * (1 + 1e-6)
        like = seen[0][1]
        agg = sum(float(shares[k]) * QSGD(levels=int(payloads[k][0]), bucket=512).decode(
            Packet(payloads[k][5:], like.shape, like.dtype)).double() for k in range(n))
        signal = max(float(agg.square().sum()) - sum(headers), 0.0)
        signals.append(signal)
        ref = signal if ref is None else 0.9 * ref + 0.1 * signal
    assert len(set(info["levels"])) > 1  # data-aware: workers with more data get finer grids
    assert min(signals) > 0  # the subtraction of Q was exercised, not clipped away


def test_bits_budget_is_met_and_header_counted(make_config, tmp_path):
    out = tmp_path / "run"
    summary = run(make_config(ADAPTIVE, algorithm="dqsgd:bits_budget=3.5", steps=60, eval_every=60))
    steps = read_jsonl(out / "steps.jsonl")
    assert np.mean([s["bits"] for s in steps]) == pytest.approx(3.5, abs=0.1)
    d = json.loads((out / "config.json").read_text())["num_parameters"]
    per_step = [sum(5 + QSGD(levels=s, bucket=512).nbytes(d) for s in st["levels"]) for st in steps]
    assert summary["bytes_sent"] == 4 * sum(per_step)  # ps allgather: every payload reaches N workers
    metrics = read_jsonl(out / "metrics.jsonl")
    assert metrics[-1]["levels"] == steps[-1]["levels"]


def test_fixed_levels_and_resume(make_config):
    info = Run(make_config(ADAPTIVE, algorithm="dqsgd:levels=5")).train_step()
    assert info["levels"] == [5] * 4 and info["bits"] == 4
    resume_matches(make_config(ADAPTIVE, algorithm="dqsgd:bits_budget=3"), first=5, then=5)
    resume_matches(make_config(ADAPTIVE, algorithm="dqsgd:error_bound=0.1"), first=3, then=4)


def test_corrupt_header_is_rejected(make_config):
    alg = Run(make_config(ADAPTIVE, algorithm="dqsgd:levels=3")).algorithm
    body = QSGD(levels=3, bucket=512).encode(alg.x).buffer
    with pytest.raises(CorruptPayload, match="header names 0 levels"):
        alg._decode(1, torch.cat([torch.zeros(1, dtype=torch.uint8), body]))


@pytest.mark.parametrize("spec, needle", [
    ("dqsgd:bits_budget=3,levels=3", "needs exactly one of error_bound"),
    ("dqsgd:error_bound=0.1,bits_budget=3", "needs exactly one of"),
    ("dqsgd:error_bound=-1", "error_bound must be > 0"),
    ("dqsgd:bits_budget=9", "bits_budget must be in"),
    ("dqsgd:levels=200", "levels must be in 1..127"),
])
def test_bad_spec_is_a_config_error(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        ALGORITHMS.build(spec)
