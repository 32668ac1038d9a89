"""SparseLoCo (Sarfi et al. 2025, arXiv:2508.15706) on the simulator: the outer loop against a
reference written from the paper's Algorithm 1 on the same batches, the error-feedback identity with
quantised values, the exact bytes of every message, and checkpoints that resume bitwise."""

import math

import pytest
import torch

from gradwire.compress import gapcode
from gradwire.compress.chunked import ChunkedTopK, chunk_counts
from gradwire.run.loop import Run
from tests.algorithms.test_local_updates_checkpoint import only_tensors_and_ints
from tests.helpers import record_inner_steps, through_bytes


def reference_topk(e: torch.Tensor, chunk: int, k: int) -> torch.Tensor:
    """TopK of the paper's Algorithm 1, chunk by chunk, written out with a loop: e where kept, else 0."""
    out = torch.zeros_like(e)
    for lo in range(0, e.numel(), chunk):
        part = e[lo: lo + chunk]
        keep = min(part.numel(), math.ceil(k * part.numel() / chunk))
        index = torch.topk(part.abs(), keep).indices
        out[lo + index] = part[index]
    return out


@pytest.mark.parametrize("spec, h, chunk, k, decay, outer_lr", [
    ("sparseloco:inner_steps=3,chunk=64,k=4,values=raw", 3, 64, 4, 0.95, 1.0),  # β, α: the documented defaults
    ("sparseloco:inner_steps=2,chunk=100,k=7,values=raw,decay=0.5,outer_lr=0.8,inner=sgd", 2, 100, 7, 0.5, 0.8),
    ("sparseloco:inner_steps=4,chunk=32,k=3,values=raw,decay=1,outer_lr=1.3", 4, 32, 3, 1.0, 1.3),
])
def test_outer_loop_matches_algorithm_1(make_config, spec, h, chunk, k, decay, outer_lr):
    """e_r <- β e_r + (θ - θ_r); Δ̂_r = TopK(e_r); e_r <- e_r - Δ̂_r; θ <- θ - α mean_r Δ̂_r; θ_r <- θ,
    on the replicas' own inner steps (gradwire's AdamW, tested against torch's in test_diloco.py). H, C,
    k, β and α are the spec's, written as literals (not read back from the algorithm)."""
    r = Run(make_config(algorithm=spec, dtype="float64", lr=0.01, workers=3))
    alg = r.algorithm
    after_inner = record_inner_steps(alg)
    theta = alg.theta.clone()
    e = {w: torch.zeros_like(theta) for w in range(3)}
    rounds = 0
    for step in range(1, 13):
        r.train_step()
        if step % h == 0:
            sent = []
            for w, x in sorted(after_inner.items()):
                e[w] = decay * e[w] + (theta - x)
                sent.append(reference_topk(e[w], chunk, k))
                e[w] = e[w] - sent[-1]
            theta = theta - outer_lr * sum(sent) / 3
            rounds += 1
            for w in range(3):
                torch.testing.assert_close(alg.accumulators[w], e[w], rtol=0, atol=1e-14)
                assert torch.equal(alg.replicas.x[w], alg.theta)
        torch.testing.assert_close(alg.theta, theta, rtol=0, atol=1e-14, msg=lambda m, s=step: f"θ after {s}: {m}")
    assert rounds == 12 // h >= 3 and not torch.equal(theta, r.model.flatten().double())


def reference_authors_aggregate(sent: list[torch.Tensor], support: list[torch.Tensor], sizes: list[int],
                                aggregate: str, clip: str) -> torch.Tensor:
    """The aggregation of the SparseLoCo authors' trainer (tplr-ai/templar, docs/low_communication.md),
    written from its description with loops: per parameter tensor, each worker's message scaled by
    min(1, median / (norm + 1e-8)) (median: the lower middle of the sorted norms); then per position
    the sum over the workers that sent it divided by their count (senders_mean) or by R (mean)."""
    R, out, start = len(sent), torch.zeros_like(sent[0]), 0
    for size in sizes:
        parts = [m[start: start + size].clone() for m in sent]
        if clip == "median_norm":
            norms = sorted(float(p.norm()) for p in parts)
            median = norms[(R - 1) // 2]
            parts = [p * min(1.0, median / (float(p.norm()) + 1e-8)) for p in parts]
        for j in range(size):
            senders = [w for w in range(R) if support[w][start + j]]
            if aggregate == "mean":
                out[start + j] = sum(float(p[j]) for p in parts) / R
            elif senders:
                out[start + j] = sum(float(parts[w][j]) for w in senders) / len(senders)
        start += size
    return out


@pytest.mark.parametrize("workers, keys", [(3, "aggregate=senders_mean"), (4, "clip=median_norm"),
                                           (4, "aggregate=senders_mean,clip=median_norm"),
                                           (3, "aggregate=senders_mean,clip=median_norm")])
def test_outer_loop_with_the_authors_aggregation_matches_a_reference(make_config, workers, keys):
    """Algorithm 1's accumulators and messages, the outer step on the authors' aggregate instead of
    the (1/R) Σ (digits-logreg: a 10x64 weight and a bias, so the clip takes two norms per worker)."""
    r = Run(make_config(algorithm=f"sparseloco:inner_steps=3,chunk=64,k=4,values=raw,{keys}", dtype="float64",
                        lr=0.01, workers=workers))
    alg = r.algorithm
    sizes = [s.numel() for s in r.model.shapes]
    assert len(sizes) == 2
    after_inner = record_inner_steps(alg)
    theta = alg.theta.clone()
    e = {k: torch.zeros_like(theta) for k in range(workers)}
    aggregate = "senders_mean" if "senders_mean" in keys else "mean"
    clip = "median_norm" if "median_norm" in keys else "none"
    clipped = spread = 0
    for step in range(1, 13):
        r.train_step()
        if step % 3 == 0:  # H = 3, β = 0.95 (the default) and α = 1 (the default): literals, not alg's
            sent, support = [], []
            for k, x in sorted(after_inner.items()):
                e[k] = 0.95 * e[k] + (theta - x)
                sent.append(reference_topk(e[k], 64, 4))
                support.append(sent[-1] != 0)
                e[k] = e[k] - sent[-1]
            update = reference_authors_aggregate(sent, support, sizes, aggregate, clip)
            plain = sum(sent) / workers
            clipped += int(not torch.allclose(update, plain))
            senders = sum(s.int() for s in support)
            spread += int(((senders > 0) & (senders < workers)).any())  # a position some but not all sent
            theta = theta - 1.0 * update
            for k in range(workers):
                torch.testing.assert_close(alg.accumulators[k], e[k], rtol=0, atol=1e-13)
        torch.testing.assert_close(alg.theta, theta, rtol=0, atol=1e-13, msg=lambda m, s=step: f"θ after {s}: {m}")
    assert clipped == 4 and spread == 4  # the rule differed from Algorithm 1's mean every round


def test_senders_mean_counts_a_kept_value_that_quantised_to_zero():
    """With ternary values a kept element can round to 0: it is still sent (its position is on the
    wire), so it counts among that position's senders; the mask is exactly each chunk's top-k."""
    from gradwire.averaging.combine import MessageCombine

    codec = ChunkedTopK(chunk=32, k=8, values="ternary", block=4)
    x = torch.randn(100, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    packet = codec.encode(x, generator=torch.Generator().manual_seed(1))
    decoded, sent = codec.decode_sent(packet)
    kept = reference_topk(x, 32, 8) != 0
    assert torch.equal(sent, kept) and torch.equal(decoded, codec.decode(packet))
    zeros = sent & (decoded == 0)
    assert zeros.any()  # this seed rounds some kept values to 0
    other = torch.zeros_like(x)
    other[zeros] = 1.0  # a second worker sends 1 at those positions
    combined = MessageCombine(aggregate="senders_mean")([decoded, other], [sent, zeros])
    assert torch.equal(combined[zeros], torch.full_like(combined[zeros], 0.5))  # (0 + 1) / 2 senders
    assert torch.equal(combined[~sent], torch.zeros_like(combined[~sent]))
    assert torch.equal(combined[sent & ~zeros], decoded[sent & ~zeros])  # one sender: its own value


@pytest.mark.parametrize("bad, message", [("aggregate=median", "aggregate='median': valid choices are mean, "
                                                               "senders_mean"),
                                          ("clip=norm", "clip='norm': valid choices are none, median_norm")])
def test_refuses_an_unknown_aggregation(make_config, bad, message):
    with pytest.raises(ValueError, match=message):
        Run(make_config(algorithm=f"sparseloco:{bad}"))


def test_ternary_values_keep_the_error_feedback_identity_and_the_chunk_supports(make_config):
    """With quantised values Δ̂_r is random, so the reference cannot replay it; what Algorithm 1
    still fixes: e_before = Δ̂_r + e_after exactly where the accumulator kept its value (elsewhere
    the unsent part stays), Δ̂_r lies in each chunk's top-k of e_r, and every value is 0 or ± its
    block's scale (the ternary grid)."""
    r = Run(make_config(algorithm="sparseloco:inner_steps=2,chunk=64,k=4,values=ternary,block=8",
                        dtype="float64", lr=0.01, workers=2))
    alg = r.algorithm
    r.train_step()
    codec = alg.averager
    captured = {}
    payloads = codec.payloads

    def capture(tensors, key):
        captured["e"] = {k: t.clone() for k, t in tensors.items()}
        captured["p"] = payloads(tensors, key=key)
        return captured["p"]

    codec.payloads = capture
    r.train_step()
    for k in range(2):
        e = captured["e"][k]
        sent = codec.decode(captured["p"][k], e)
        support = reference_topk(e, 64, 4) != 0
        assert not sent[~support].any()
        torch.testing.assert_close(alg.accumulators[k], e - sent, rtol=0, atol=0)
        for block in sent[support].split(8):  # kept values in position order, 8 per float32 scale
            magnitudes = block[block != 0].abs()
            assert magnitudes.numel() and torch.equal(magnitudes, magnitudes[:1].expand_as(magnitudes))


@pytest.mark.parametrize("keys", ["", ",aggregate=senders_mean,clip=median_norm"])
def test_message_bytes_are_the_values_and_the_gap_coded_positions(make_config, keys):
    """Each replica's message is K float64 values then gapcode's section for its positions; it
    travels framed at the codec's bound (a 4-byte length, then the message, then zeros up to K values
    and the largest section of K positions), so no sizes are exchanged; the ring all-gather of n
    frames counts (n - 1) times their sum (network.py). The authors' aggregation changes only the
    receiving end: the same message, the same bytes."""
    cfg = make_config(algorithm=f"sparseloco:inner_steps=2,chunk=50,k=3,values=raw{keys}", dtype="float64", lr=0.01,
                      workers=3, network="ring:mbps=100,latency_ms=1")
    r = Run(cfg)
    alg = r.algorithm
    n = alg.theta.numel()
    full, tail, k_tail = chunk_counts(n, 50, 3)
    count = 3 * full + k_tail
    expected = 0
    payloads = alg.averager.payloads

    def sized(tensors, key):
        nonlocal expected
        out = payloads(tensors, key=key)
        for k, buf in out.items():
            index = (alg.averager.decode(buf, tensors[k]) != 0).nonzero().view(-1)
            assert index.numel() == count == ChunkedTopK(chunk=50, k=3).count(n)
            size = 8 * count + gapcode.section_bytes(n, count, gapcode.quotient_sum(n, index))
            assert buf.numel() == size and size - 8 * count < count  # under 8 bits a position at 6% density
            framed = 4 + 8 * count + gapcode.max_section_bytes(n, count)
            assert size < framed < 1.1 * (size + 4)
            expected += 2 * framed  # (n - 1) = 2 other replicas receive it
        return out

    alg.averager.payloads = sized
    for _ in range(8):
        r.train_step()
    assert r.transport.bytes_sent == expected > 0


SPECS = [("sparseloco:inner_steps=3,chunk=64,k=4", {}),
         ("sparseloco:inner_steps=3,chunk=64,k=4,aggregate=senders_mean,clip=median_norm", {}),
         ("sparseloco:inner_steps=2,chunk=32,k=2,values=raw,inner=sgd", dict(momentum=0.9))]


@pytest.mark.parametrize("spec, extra", SPECS)
def test_resume_mid_run_equals_never_stopping(make_config, spec, extra):
    cfg = make_config(algorithm=spec, lr=0.01, stragglers="lognormal:sigma=0.5,compute_s=0.05", **extra)
    straight = Run(cfg)
    expected = [straight.train_step() for _ in range(10)]
    first = Run(cfg)
    for _ in range(4):
        first.train_step()
    state = first.state_dict()
    only_tensors_and_ints(first.algorithm.state_dict(), spec)
    resumed = Run(cfg)
    resumed.load_state_dict(through_bytes(state))
    assert [resumed.train_step() for _ in range(6)] == expected[4:]
    for k, e in straight.algorithm.accumulators.items():
        assert torch.equal(resumed.algorithm.accumulators[k], e) and e.any()
    assert torch.equal(resumed.algorithm.theta, straight.algorithm.theta)
    assert resumed.transport.bytes_sent == straight.transport.bytes_sent


def test_refuses_another_compressor(make_config):
    with pytest.raises(ValueError, match="--compressor and --error-feedback do not apply"):
        Run(make_config(algorithm="sparseloco", compressor="qsgd"))
