"""DeMo (Peng et al. 2024, arXiv:2411.19870) on the simulator: the run against a reference written
from the paper's Algorithm 1 on the same batches (its DCT from scipy, its top-k chunk by chunk),
exact message bytes, and checkpoints that resume bitwise."""

import math

import numpy as np
import pytest
import scipy.fft
import torch

from gradwire.algorithms.demo import ChunkDCT
from gradwire.compress import gapcode
from gradwire.run.loop import Run
from tests.algorithms.test_local_updates_checkpoint import only_tensors_and_ints
from tests.helpers import record_gradients, through_bytes


def extract_fast_components(m: np.ndarray, s: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1's ExtractFastComponents on 1-D chunks: DCT-II (orthonormal) of each chunk of s,
    its k largest coefficients (the last, shorter chunk: ceil(k L / s)), the inverse DCT of those.
    Returns (q, the kept coefficients as a dense vector)."""
    q, kept = np.zeros_like(m), np.zeros_like(m)
    for lo in range(0, m.size, s):
        c = scipy.fft.dct(m[lo: lo + s], norm="ortho")
        keep = min(c.size, math.ceil(k * c.size / s))
        top = np.argsort(-np.abs(c), kind="stable")[:keep]
        sparse = np.zeros_like(c)
        sparse[top] = c[top]
        kept[lo: lo + s] = sparse
        q[lo: lo + s] = scipy.fft.idct(sparse, norm="ortho")
    return q, kept


def test_chunk_dct_is_scipys_orthonormal_dct_ii():
    v = torch.randn(150, dtype=torch.float64)
    dct = ChunkDCT(150, 64, torch.float64, v.device)
    expected = np.concatenate([scipy.fft.dct(v.numpy()[lo: lo + 64], norm="ortho") for lo in range(0, 150, 64)])
    torch.testing.assert_close(dct.forward(v), torch.from_numpy(expected), rtol=0, atol=1e-13)
    torch.testing.assert_close(dct.inverse(dct.forward(v)), v, rtol=0, atol=1e-13)


@pytest.mark.parametrize("spec, decay, chunk, k, sign, weight_decay", [
    ("demo:chunk=64,k=4", 0.999, 64, 4, True, 0.0),  # β, sign and λ: the documented defaults
    ("demo:chunk=50,k=3,decay=0.9,sign=false,weight_decay=0.1", 0.9, 50, 3, False, 0.1),
    ("demo:chunk=32,k=5,decay=0.5,sign=true,weight_decay=0.2", 0.5, 32, 5, True, 0.2),
])
def test_steps_match_algorithm_1(make_config, spec, decay, chunk, k, sign, weight_decay):
    """m_i <- β m_i + g_i; q_i = ExtractFastComponents(m_i); m_i <- m_i - q_i; Q = mean_i q_i;
    x <- (1 - ηλ) x - η sign(Q) (or - η Q), on the workers' own minibatch gradients at x. β, s, k, the
    sign and λ are the spec's, written as literals (not read back from the algorithm)."""
    r = Run(make_config(algorithm=spec, dtype="float64", lr=0.01, workers=3))
    alg = r.algorithm
    grads = record_gradients(r)
    x = alg.x.numpy().copy()
    m = {w: np.zeros_like(x) for w in range(3)}
    for step in range(1, 9):
        x_before = x.copy()
        r.train_step()
        qs = []
        for w in range(3):
            m[w] = decay * m[w] + grads[w].numpy()
            q, _ = extract_fast_components(m[w], chunk, k)
            m[w] = m[w] - q
            qs.append(q)
            np.testing.assert_allclose(alg.momentum[w].numpy(), m[w], rtol=0, atol=1e-12)
        big_q = sum(qs) / 3
        x = x_before * (1 - 0.01 * weight_decay) - 0.01 * (np.sign(big_q) if sign else big_q)
        if sign:  # sign() of a float that rounds near 0 could differ: none do here
            assert np.abs(big_q[big_q != 0]).min() > 1e-10
        else:  # a signed step would differ: Q's elements are far from ±1
            assert np.abs(np.abs(big_q[big_q != 0]) - 1).min() > 1e-3
        np.testing.assert_allclose(alg.x.numpy(), x, rtol=0, atol=1e-12, err_msg=f"x after step {step}")
    assert not np.array_equal(x, r.model.flatten().double().numpy())


def test_message_bytes_are_the_coefficients_and_their_gap_coded_positions(make_config):
    cfg = make_config(algorithm="demo:chunk=64,k=4", dtype="float64", lr=0.01, workers=3,
                      network="ring:mbps=100,latency_ms=1")
    r = Run(cfg)
    n = r.algorithm.x.numel()
    count = 4 * (n // 64) + math.ceil(4 * (n % 64) / 64)
    expected = 0
    encode = r.algorithm.averager.encode

    def sized(rank, x, **kw):
        nonlocal expected
        packet = encode(rank, x, **kw)
        index = (r.algorithm.averager.decode(packet.buffer, x) != 0).nonzero().view(-1)
        assert index.numel() == count
        assert packet.nbytes == 8 * count + gapcode.section_bytes(n, count, gapcode.quotient_sum(n, index))
        # ring all-gather: each message crosses (n - 1) = 2 links, framed at the codec's bound (a 4-byte
        # length, zeros up to the largest section of `count` positions), so no sizes are exchanged first
        expected += 2 * (4 + 8 * count + gapcode.max_section_bytes(n, count))
        return packet

    r.algorithm.averager.encode = sized
    for _ in range(4):
        r.train_step()
    assert r.transport.bytes_sent == expected > 0


def test_resume_mid_run_equals_never_stopping(make_config):
    cfg = make_config(algorithm="demo:chunk=32,k=2", lr=0.01, lr_schedule="cosine:warmup=2,min_ratio=0.1",
                      stragglers="lognormal:sigma=0.5,compute_s=0.05")
    straight = Run(cfg)
    expected = [straight.train_step() for _ in range(8)]
    first = Run(cfg)
    for _ in range(3):
        first.train_step()
    only_tensors_and_ints(first.algorithm.state_dict(), "demo")
    resumed = Run(cfg)
    resumed.load_state_dict(through_bytes(first.state_dict()))
    assert [resumed.train_step() for _ in range(5)] == expected[3:]
    assert torch.equal(resumed.algorithm.x, straight.algorithm.x)
    assert all(torch.equal(resumed.algorithm.momentum[k], m) for k, m in straight.algorithm.momentum.items())
    assert resumed.transport.bytes_sent == straight.transport.bytes_sent and resumed.clock.now == straight.clock.now


def test_refuses_momentum_and_compressors(make_config):
    with pytest.raises(ValueError, match="--momentum, --nesterov and --weight-decay do not apply"):
        Run(make_config(algorithm="demo", momentum=0.9))
    with pytest.raises(ValueError, match="--compressor and --error-feedback do not apply"):
        Run(make_config(algorithm="demo", compressor="topk"))
