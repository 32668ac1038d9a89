"""PowerSGD's math in one process: the invariants of Vogels, Karimireddy, Jaggi (2019), shapes and
ranks, device-generic buffers, and one clear error per bad setting."""

from __future__ import annotations

import re
import threading

import pytest
import torch

from gradwire.averaging.powersgd import (
    AVERAGERS,
    PowerSGDMean,
    PowerSGDMemory,
    matrix_shape,
    orthogonalize_,
    orthogonalized,
)
from gradwire.errors import ConfigError

SHAPES = [torch.Size(s) for s in [(40, 30), (40,), (6, 3, 5), (3, 100), (2, 2), ()]]
KEYS = [f"t{i}" for i in range(len(SHAPES))]


def local_mean(tensors: dict[int, torch.Tensor]) -> torch.Tensor:
    """The allreduce of one process hosting every worker: the mean, summed in rank order."""
    order = sorted(tensors)
    total = tensors[order[0]].clone()
    for w in order[1:]:
        total += tensors[w]
    return total / len(order)


def gradients(workers: int, seed: int, dtype=torch.float32) -> dict[int, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {w: [torch.randn(s, generator=g, dtype=dtype) for s in SHAPES] for w in range(workers)}


def test_matrix_rank_follows_the_compression_rule_and_caps_at_min_n_m():
    p = AVERAGERS.build("powersgd:rank=4")
    # 40x30: 1200 > 2*70*4; vectors and scalars never; 6x15: 90 <= 2*21*4; 2x2 never pays
    assert [p.matrix_rank(s) for s in SHAPES] == [4, 0, 0, 0, 0, 0]
    assert matrix_shape((6, 3, 5)) == (6, 15) and matrix_shape((7,)) is None
    # rank 8 on a 3x100 matrix is capped at 3 (already exact); it pays only with a rate below 1
    assert AVERAGERS.build("powersgd:rank=8").matrix_rank((3, 100)) == 0
    assert AVERAGERS.build("powersgd:rank=8,min_compression_rate=0.5").matrix_rank((3, 100)) == 3
    assert p.wire_numel(SHAPES) == 70 * 4 + 40 + 90 + 300 + 4 + 1
    # on the boundary n m = rate (n + m) r the tensor travels uncompressed (PyTorch's hook: strictly more)
    one = AVERAGERS.build("powersgd:rank=1")
    assert one.matrix_rank((4, 4)) == 0 and one.matrix_rank((5, 4)) == 1
    # the cap decides: rank 8 on 64x4 is 4, and 64*4 > 0.5*68*4 pays where 0.5*68*8 would not
    low = AVERAGERS.build("powersgd:rank=8,min_compression_rate=0.5")
    assert low.matrix_rank((64, 4)) == 4 and low.wire_numel([(64, 4)]) == 68 * 4


@pytest.mark.parametrize("spec,width", [("powersgd:rank=2", 4), ("powersgd:rank=2,dtype=fp16", 2),
                                        ("powersgd:rank=2,dtype=bf16", 2),
                                        ("powersgd:rank=2,dtype=fp16,warm_start=true,alternate=true", 2)])
def test_algorithm_json_gives_the_bytes_of_the_factors_dtype(spec, width):
    from gradwire.averaging.powersgd import PowerSGDMean

    info = PowerSGDMean(spec, shapes=[(64, 32), (32,)], workers=[0], seed=0).setup_info()["powersgd"]
    if "alternate=true" in spec:  # P (64 x 2) and Q (32 x 2) take turns; the bias travels with each
        assert info["floats_per_worker_p_step"] == 64 * 2 + 32 and info["floats_per_worker_q_step"] == 32 * 2 + 32
        assert info["bytes_per_worker_p_step"] == width * info["floats_per_worker_p_step"]
        assert info["bytes_per_worker_q_step"] == width * info["floats_per_worker_q_step"]
    else:
        assert info["floats_per_worker_step"] == (64 + 32) * 2 + 32
        assert info["bytes_per_worker_step"] == width * info["floats_per_worker_step"]


def gram_schmidt(p: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns by classical Gram-Schmidt, column by column (the paper's ORTHOGONALIZE)."""
    q = p.clone()
    for j in range(q.shape[1]):
        for i in range(j):
            q[:, j] -= (q[:, i] @ q[:, j]) * q[:, i]
        q[:, j] /= q[:, j].norm()
    return q


def reference_step(grads: dict[int, torch.Tensor], errors: dict[int, torch.Tensor], q: torch.Tensor):
    """One step of PowerSGD on one n x m matrix, written from Vogels, Karimireddy & Jaggi (2019),
    Algorithm 1 (rank-r power iteration, warm-started from ``q``) with Algorithm 2's error feedback:
    M_w = G_w + e_w; P = mean_w M_w Q; P^ = ORTHOGONALIZE(P); Q = mean_w M_w^T P^; the mean is
    P^ Q^T; e_w = M_w - P^ Q^T. Returns (mean, new errors, new Q)."""
    m = {w: g + errors[w] for w, g in grads.items()}
    p_hat = gram_schmidt(sum(mw @ q for mw in m.values()) / len(m))
    q_new = sum(mw.T @ p_hat for mw in m.values()) / len(m)
    approx = p_hat @ q_new.T
    return approx, {w: mw - approx for w, mw in m.items()}, q_new


def threaded_allreduce(workers: int):
    """An allreduce_mean for one thread per worker: each thread passes its own contribution
    ({rank: tensor}); every thread gets the mean summed in rank order (bounded waits)."""
    barrier, box = threading.Barrier(workers), {}

    def allreduce_mean(tensors):
        (rank, t), = tensors.items()
        box[rank] = t
        barrier.wait(timeout=30)
        mean = local_mean(dict(box))
        barrier.wait(timeout=30)  # every thread has read the box before the next call refills it
        return mean

    return allreduce_mean


def test_three_steps_equal_the_papers_algorithm_at_every_worker():
    """Three steps of rank-2 PowerSGD with warm start and error feedback, in float64, equal the
    paper's Algorithm 1 + 2 written out above, for every compressed matrix (each started from a Q
    the test draws), the others arriving as their exact mean; and one thread per worker, each with
    its own memory and only its own gradients, gets the same means as the one process hosting all."""
    workers = 3
    p = AVERAGERS.build("powersgd:rank=2,min_compression_rate=1")
    compressed = {i: matrix_shape(s) for i, s in enumerate(SHAPES) if p.matrix_rank(s)}
    assert sorted(compressed) == [0, 2, 3]
    g = torch.Generator().manual_seed(7)
    q0 = {i: torch.randn(m, 2, generator=g, dtype=torch.float64) for i, (_, m) in compressed.items()}
    steps = [gradients(workers, 10 + k, dtype=torch.float64) for k in range(3)]

    memory = PowerSGDMemory(seed=1)
    memory.q.update({KEYS[i]: q.clone() for i, q in q0.items()})
    per_worker = [PowerSGDMemory(seed=1) for _ in range(workers)]
    for mem in per_worker:
        mem.q.update({KEYS[i]: q.clone() for i, q in q0.items()})
    ref_q = dict(q0)
    ref_e = {i: {w: torch.zeros(n, m, dtype=torch.float64) for w in range(workers)} for i, (n, m) in compressed.items()}
    allreduce = threaded_allreduce(workers)
    for grads in steps:
        out = p.average(memory, grads, KEYS, local_mean)
        threaded: list = [None] * workers

        def work(w, grads=grads, threaded=threaded):
            threaded[w] = p.average(per_worker[w], {w: grads[w]}, KEYS, allreduce)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        for i, shape in enumerate(SHAPES):
            if i in compressed:
                n, m = compressed[i]
                want, ref_e[i], ref_q[i] = reference_step({w: grads[w][i].reshape(n, m) for w in grads},
                                                          ref_e[i], ref_q[i])
                want = want.view(shape)
            else:
                want = sum(grads[w][i] for w in grads) / workers
            torch.testing.assert_close(out[i], want, rtol=1e-10, atol=1e-10)
            for w in range(workers):
                assert torch.equal(threaded[w][i], out[i])  # the same sums in the same order
        for i in compressed:
            for w in range(workers):
                torch.testing.assert_close(memory.errors[w][KEYS[i]], ref_e[i][w], rtol=1e-10, atol=1e-10)
                assert torch.equal(per_worker[w].errors[w][KEYS[i]], memory.errors[w][KEYS[i]])
        for mem in (memory, *per_worker):
            mem.step += 1
    assert sorted(memory.q) == ["t0", "t2", "t3"] and memory.q["t3"].shape == (100, 2)


def test_a_matrix_of_rank_r_travels_exactly():
    """P Q^T reproduces M when M (the mean of the workers' matrices) has rank <= r."""
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(50, 2, generator=g, dtype=torch.float64), torch.randn(2, 40, generator=g, dtype=torch.float64)
    grads = {w: [(w + 1) * u @ v] for w in range(2)}
    out = AVERAGERS.build("powersgd:rank=2").average(PowerSGDMemory(), grads, ["m"], local_mean)
    torch.testing.assert_close(out[0], 1.5 * u @ v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_mean_of_rank_below_r_travels_exactly(dtype, device):
    """A rank-1 mean at rank 2 (each weight gradient of a batch of one is rank 1): Gram-Schmidt's
    second column is rounding noise, which must become zero, not a normalised direction that breaks
    P^ P^T (it came out 7-85 % off, in either dtype); and again with error feedback, over steps."""
    g = torch.Generator().manual_seed(3)
    for error_feedback in ("false", "true"):
        p = AVERAGERS.build(f"powersgd:rank=2,error_feedback={error_feedback}")
        memory = PowerSGDMemory(seed=1)
        for step in range(4):
            u, v = torch.randn(64, 1, generator=g, dtype=dtype), torch.randn(1, 48, generator=g, dtype=dtype)
            u, v = u.to(device), v.to(device)
            grads = {w: [(w + 1) * u @ v] for w in range(2)}
            out = p.average(memory, grads, ["m"], local_mean)[0]
            memory.step += 1
            exact = 1.5 * u @ v
            assert float((out - exact).norm() / exact.norm()) < 1e-5, (error_feedback, step)


def test_float16_factors_of_large_gradients_are_not_lost(device):
    """Float16 gradients (a loss-scaled model through the DDP hook) whose P columns have norms past
    float16's 65504: the orthogonalisation works in float32, so the mean is the float32 run's up to
    float16 rounding (it was divided by an infinite norm: all zeros)."""
    g = torch.Generator().manual_seed(0)
    grads = [{0: [2000 * torch.randn(512, 512, generator=g).to(device)]} for _ in range(3)]  # Q's norm ~ 2000·2√512
    p = AVERAGERS.build("powersgd:rank=1")
    half, full = PowerSGDMemory(seed=2), PowerSGDMemory(seed=2)
    for step, grad in enumerate(grads):
        a = p.average(half, {0: [grad[0][0].half()]}, ["m"], local_mean)[0]
        b = p.average(full, {0: [grad[0][0].half().float()]}, ["m"], local_mean)[0]
        half.step += 1
        full.step += 1
        assert a.dtype == torch.float16 and bool(torch.isfinite(a).all())
        assert float((a.float() - b).norm() / b.norm()) < 2e-2, step


def test_before_start_step_everything_is_averaged_uncompressed():
    p = AVERAGERS.build("powersgd:rank=1,start_step=2")
    memory = PowerSGDMemory()
    for step in range(3):
        grads = gradients(2, step)
        out = p.average(memory, grads, KEYS, local_mean)
        exact = all(torch.allclose(o, (grads[0][i] + grads[1][i]) / 2) for i, o in enumerate(out))
        assert exact == (step < 2) and (not memory.q) == (step < 2)
        memory.step += 1


def test_warm_start_and_fresh_draws():
    """warm_start=true: the second step's power iteration starts from the first step's Q (the paper's
    reference started from that Q gives its mean); false: from a fresh draw that ignores it (the mean
    equals that of a memory that never held a Q, with the same errors)."""
    p_warm = AVERAGERS.build("powersgd:rank=2,warm_start=true")
    p_cold = AVERAGERS.build("powersgd:rank=2,warm_start=false")
    first, second = gradients(2, 0, dtype=torch.float64), gradients(2, 1, dtype=torch.float64)
    n, m = SHAPES[0][0], SHAPES[0][1]
    outs = {}
    for name, p in (("warm", p_warm), ("cold", p_cold)):
        a, b = PowerSGDMemory(seed=4), PowerSGDMemory(seed=4)
        assert all(torch.equal(x, y) for x, y in zip(p.average(a, first, KEYS, local_mean),
                                                      p.average(b, first, KEYS, local_mean), strict=True))
        a.step = 1
        q_before = a.q["t0"].clone()
        errors = {w: a.errors[w]["t0"].clone() for w in second}
        outs[name] = p.average(a, second, KEYS, local_mean)[0]
        if name == "warm":
            want, _, _ = reference_step({w: second[w][0].reshape(n, m) for w in second}, errors, q_before)
            torch.testing.assert_close(outs[name], want, rtol=1e-10, atol=1e-10)
        else:
            never = PowerSGDMemory(seed=4)
            never.step = 1
            never.errors = {w: {"t0": errors[w].clone()} for w in second}
            assert torch.equal(outs[name], p.average(never, {w: [second[w][0]] for w in second}, ["t0"], local_mean)[0])
    assert not torch.allclose(outs["warm"], outs["cold"])


def test_orthogonalize_makes_orthonormal_columns_and_keeps_zero_columns_zero():
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    orthogonalize_(x)
    torch.testing.assert_close(x.T @ x, torch.eye(4, dtype=torch.float64))
    z = torch.zeros(10, 2)
    assert torch.equal(orthogonalize_(z), torch.zeros(10, 2))
    out = AVERAGERS.build("powersgd:rank=2").average(PowerSGDMemory(), {0: [torch.zeros(40, 30)]}, ["w"], local_mean)
    assert torch.equal(out[0], torch.zeros(40, 30))  # a vanished gradient is no NaN


def test_orthogonalized_batches_equal_one_matrix_at_a_time():
    """Batched by shape (Gram-Schmidt up to 2 columns, Householder QR with signs fixed above), each
    full-rank matrix gets what Gram-Schmidt gives it alone, and the inputs stay untouched. A zero
    column stays zero; the columns after it are orthonormal (QR completes them against another
    direction than Gram-Schmidt, which only skips it: a different basis, equally valid for P^ Q^T)."""
    g = torch.Generator().manual_seed(1)
    sizes = [(30, 4), (12, 2), (30, 4), (30, 3), (12, 2), (30, 1)]
    mats = [torch.randn(n, r, generator=g, dtype=torch.float64) for n, r in sizes]
    before = [m.clone() for m in mats]
    out = orthogonalized(mats)
    for m, b, o in zip(mats, before, out, strict=True):
        assert torch.equal(m, b)
        torch.testing.assert_close(o, orthogonalize_(b.clone()), rtol=1e-12, atol=1e-12)
    holed = torch.randn(30, 4, generator=g, dtype=torch.float64)
    holed[:, 1] = 0
    for r in (2, 4):  # Gram-Schmidt, then QR
        o = orthogonalized([holed[:, :r], holed[:, :r]])[1]
        assert torch.equal(o[:, 1], torch.zeros(30, dtype=torch.float64))
        kept = o[:, [c for c in range(r) if c != 1]]
        torch.testing.assert_close(kept.T @ kept, torch.eye(r - 1, dtype=torch.float64))
    assert torch.equal(orthogonalized([torch.zeros(10, 3)])[0], torch.zeros(10, 3))  # no NaN


@pytest.mark.parametrize("dtype, wire, unit", [("fp16", torch.float16, 2.0**-11), ("bf16", torch.bfloat16, 2.0**-8)])
def test_sixteen_bit_factors_travel_rounded_and_error_feedback_keeps_the_rounding(dtype, wire, unit):
    """dtype=fp16/bf16: both allreduces carry the wire dtype (half the bytes of fp32); the mean is
    the fp32 run's within the rounding, and the error-feedback identity still holds exactly, because
    the rounded Q is the one the approximation (and so the error) is built from."""
    seen = []

    def recording_mean(tensors):
        seen.append({t.dtype for t in tensors.values()})
        return local_mean({w: t.float() for w, t in tensors.items()})  # as the simulator sums: in fp32

    half = AVERAGERS.build(f"powersgd:rank=2,min_compression_rate=1,dtype={dtype}")
    full = AVERAGERS.build("powersgd:rank=2,min_compression_rate=1")
    assert half.wire_dtype(torch.float32) == wire and full.wire_dtype(torch.float64) == torch.float64
    grads = gradients(3, 0)
    a, b = PowerSGDMemory(seed=1), PowerSGDMemory(seed=1)
    out = half.average(a, grads, KEYS, recording_mean)
    ref = full.average(b, grads, KEYS, local_mean)
    assert seen == [{wire}, {wire}]
    for i, (x, y) in enumerate(zip(out, ref, strict=True)):
        assert x.dtype == torch.float32 and x.shape == SHAPES[i]
        # a few roundings of the factors, carried through two products: measured within one unit of
        # roundoff of the largest entry (bf16 0.67, fp16 0.6); 8 units leave room and still catch a
        # mean that is 3 % off for bf16, 0.4 % for fp16
        torch.testing.assert_close(x, y, rtol=0, atol=8 * unit * float(y.abs().max()))
        if half.matrix_rank(SHAPES[i]):
            assert not torch.equal(x, y)  # the rounding is real
    for w in grads:
        m = grads[w][0]
        torch.testing.assert_close(m, out[0] + a.errors[w]["t0"], rtol=0, atol=1e-6)


def test_no_tensor_is_made_on_the_default_device():
    """Under ``torch.device("meta")`` any factory call without ``device=`` makes a meta tensor,
    which would fail against the CPU inputs or show in the outputs (as tests/compress/test_devices.py)."""
    p = AVERAGERS.build("powersgd:rank=2,min_compression_rate=1")
    want_memory = PowerSGDMemory(seed=2)
    want = [p.average(want_memory, gradients(2, s), KEYS, local_mean) for s in range(2)]
    memory = PowerSGDMemory(seed=2)
    with torch.device("meta"):
        got = [p.average(memory, gradients_on_cpu(2, s), KEYS, local_mean) for s in range(2)]
    for a, b in zip(want, got, strict=True):
        assert all(y.device.type == "cpu" and torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(q.device.type == "cpu" for q in memory.q.values())


def gradients_on_cpu(workers: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return {w: [torch.randn(s, generator=g, device="cpu") for s in SHAPES] for w in range(workers)}


def test_state_dict_round_trip_and_shape_check():
    p = AVERAGERS.build("powersgd:rank=2")
    memory = PowerSGDMemory(seed=3)
    p.average(memory, gradients(2, 0), KEYS, local_mean)
    state = memory.state_dict()
    copy = PowerSGDMemory()
    copy.load_state_dict(state, shapes={"t0": (40, 30), "t2": (6, 15)})
    assert copy.seed == 3 and torch.equal(copy.q["t0"], memory.q["t0"]) and torch.equal(
        copy.errors[1]["t0"], memory.errors[1]["t0"])
    with pytest.raises(ConfigError, match=r"unknown tensors or of the wrong size: \['t0'\]"):
        PowerSGDMemory().load_state_dict(state, shapes={"t0": (40, 31), "t2": (6, 15)})


@pytest.mark.parametrize("alternate", ["", ",alternate=true"])
@pytest.mark.parametrize("saved_at, loaded_at, message", [
    ("rank=2", "rank=1", "tensor '0' was compressed at rank 2, this averager (rank=1) compresses it at rank 1"),
    ("rank=1", "rank=2", "tensor '0' was compressed at rank 1, this averager (rank=2) compresses it at rank 2"),
    ("rank=2", "rank=2,min_compression_rate=8", "tensor '0' was compressed at rank 2, this averager (rank=2) "
                                                "sends it uncompressed"),
], ids=["2-into-1", "1-into-2", "2-into-uncompressed"])
def test_a_state_of_another_rank_is_refused_in_one_line(alternate, saved_at, loaded_at, message):
    """A state whose factors have another rank than the averager's is one ConfigError naming both,
    and leaves the averager as it was: its next mean is a fresh averager's. (Accepted, PowerSGD
    would restart Q from its first draw, but ACP-SGD's Q step starts from the saved P: it crashed.)"""
    shapes = [torch.Size([16, 8])]
    g = torch.Generator().manual_seed(0)
    grads = [{w: [torch.randn(16, 8, generator=g)] for w in (0, 1)} for _ in range(3)]
    saved = PowerSGDMean(f"powersgd:{saved_at}{alternate}", shapes=shapes, workers=[0, 1], seed=0)
    for step in (0, 1):  # a P step and a Q step with alternate: both P and Q are in the state
        saved.mean_tensors_by(local_mean, grads[step], [0])
        saved.end_step()
    loaded, fresh = (PowerSGDMean(f"powersgd:{loaded_at}{alternate}", shapes=shapes, workers=[0, 1], seed=0)
                     for _ in range(2))
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        loaded.load_state_dict(saved.state_dict())
    assert "\n" not in str(info.value)
    assert loaded.memory.step == 0 and not loaded.memory.q and not loaded.memory.errors
    assert torch.equal(loaded.mean_tensors_by(local_mean, grads[2], [0])[0],
                       fresh.mean_tensors_by(local_mean, grads[2], [0])[0])


@pytest.mark.parametrize("spec, message", [
    ("powersgd:rank=0", "rank must be an integer >= 1, got 0"),
    ("powersgd:rank=two", "'powersgd': rank='two' is not a valid int"),
    ("powersgd:min_compression_rate=0", "min_compression_rate must be a finite number > 0"),
    ("powersgd:start_step=-1", "start_step must be >= 0"),
    ("powersgd:rnak=2", "has no parameter 'rnak'; valid parameters: rank, min_compression_rate"),
    ("powersgd:dtype=fp8", "dtype must be one of fp32, fp16, bf16, got 'fp8'"),
])
def test_bad_spec_is_one_clear_error(spec, message):
    with pytest.raises(ConfigError, match=message) as info:
        AVERAGERS.build(spec)
    assert "\n" not in str(info.value) and "compressor" in str(info.value)


def test_alternate_projects_the_mean_on_the_last_steps_subspace_one_allreduce_a_step():
    """ACP-SGD (alternate=true): step 1 sends P = M Q^ (Q^ the orthonormalised first Q), step 2 sends
    Q = M^T P^ (P^ step 1's P orthonormalised); the result is the mean gradient projected on that
    subspace, M Q^ Q^^T then P^ P^^T M. One allreduce a step, of n r then m r floats per matrix."""
    p = AVERAGERS.build("powersgd:rank=3,alternate=true,error_feedback=false")
    memory = PowerSGDMemory(seed=2)
    sizes = []

    def recording_mean(tensors):
        sizes.append(next(iter(tensors.values())).numel())
        return local_mean(tensors)

    grads1, grads2 = gradients(2, 10), gradients(2, 11)
    q0 = torch.randn(30, 3, generator=torch.Generator().manual_seed(8))
    memory.q["t0"] = q0.clone()  # the Q the first step starts from: the test's own
    first_q = gram_schmidt(q0)
    out1 = p.average(memory, grads1, KEYS, recording_mean)
    memory.step += 1
    mean1 = (grads1[0][0] + grads1[1][0]) / 2
    torch.testing.assert_close(out1[0], mean1 @ first_q @ first_q.T)
    basis = gram_schmidt(mean1 @ first_q)
    out2 = p.average(memory, grads2, KEYS, recording_mean)
    memory.step += 1
    mean2 = (grads2[0][0] + grads2[1][0]) / 2
    torch.testing.assert_close(out2[0], basis @ basis.T @ mean2)
    plain = 40 + 90 + 300 + 4 + 1
    assert sizes == [40 * 3 + plain, 30 * 3 + plain]  # P of the 40x30 matrix, then its Q
    assert sizes == [p.wire_numel(SHAPES, "p"), p.wire_numel(SHAPES, "q")]
    assert p.wire_numel(SHAPES, "p") + p.wire_numel(SHAPES, "q") == p.wire_numel(SHAPES) + plain
    for i in (1, 2, 3, 4, 5):  # the tensors it does not compress arrive as their exact mean
        torch.testing.assert_close(out2[i], (grads2[0][i] + grads2[1][i]) / 2)


@pytest.mark.parametrize("start_step", [1, 2, 3])
def test_alternate_counts_its_turns_from_start_step(start_step):
    """With start_step: the steps before it travel uncompressed, the first compressed step sends P
    (there is no P to start a Q step from), and P and Q take turns from there, whatever the parity of
    start_step: one allreduce a step, of every float, then n r and m r floats of the 40x30 matrix."""
    p = AVERAGERS.build(f"powersgd:rank=3,alternate=true,start_step={start_step}")
    memory = PowerSGDMemory(seed=1)
    sizes = []

    def recording_mean(tensors):
        sizes.append(next(iter(tensors.values())).numel())
        return local_mean(tensors)

    for step in range(start_step + 4):
        p.average(memory, gradients(2, step), KEYS, recording_mean)
        memory.step += 1
    plain = 40 + 90 + 300 + 4 + 1  # the tensors rank 3 does not compress travel with each factor
    whole, p_step, q_step = 40 * 30 + plain, 40 * 3 + plain, 30 * 3 + plain
    assert (p_step, q_step) == (p.wire_numel(SHAPES, "p"), p.wire_numel(SHAPES, "q"))
    assert sizes == [whole] * start_step + [p_step, q_step, p_step, q_step]


def test_alternate_keeps_the_error_feedback_identity_and_its_state_round_trips():
    p = AVERAGERS.build("powersgd:rank=2,min_compression_rate=1,alternate=true,dtype=fp16")
    memory = PowerSGDMemory(seed=4)
    for step in range(4):
        grads = gradients(3, 20 + step)
        before = {w: {k: e.clone() for k, e in memory.errors.get(w, {}).items()} for w in grads}
        out = p.average(memory, grads, KEYS, local_mean)
        memory.step += 1
        for w in grads:
            corrected = grads[w][0] + before[w].get("t0", 0)
            torch.testing.assert_close(corrected, out[0] + memory.errors[w]["t0"])
    assert sorted(memory.p) == sorted(memory.q) == ["t0", "t2", "t3"]
    state = memory.state_dict()
    again = PowerSGDMemory()
    shapes = {k: matrix_shape(s) for k, s in zip(KEYS, SHAPES, strict=True) if len(s) >= 2}
    again.load_state_dict(state, shapes=shapes)
    for step in (4, 5):  # a P step, then a Q step, which starts from the restored P
        assert p.sends_p(memory, "t0") == (step == 4) == p.sends_p(again, "t0")
        grads = gradients(3, 99 + step)
        a = p.average(memory, grads, KEYS, local_mean)
        b = p.average(again, grads, KEYS, local_mean)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        memory.step += 1
        again.step += 1
    state["p"]["t0"] = torch.zeros(7, 2)
    with pytest.raises(ConfigError, match=r"wrong size: \['t0'\]"):
        PowerSGDMemory().load_state_dict(state, shapes=shapes)


@pytest.mark.parametrize("spec", ["powersgd:rank=2", "powersgd:rank=2,alternate=true"])
def test_a_matrix_whose_mean_was_exactly_zero_for_a_step_is_compressed_again_afterwards(spec):
    """A layer whose gradient is exactly zero for one step (behind a zero-initialised layer) leaves
    a zero factor; power iteration from it would send zeros for good (the mean 0, the error growing
    without end). The zero columns are drawn again: with PowerSGD the next step equals that of a
    worker that never saw the zero step; with ACP-SGD the Q step starts from a P drawn afresh."""
    p = AVERAGERS.build(spec)
    memory, fresh = PowerSGDMemory(seed=3), PowerSGDMemory(seed=3)
    zero = {w: [torch.zeros(40, 30)] for w in range(2)}
    p.average(memory, zero, ["w"], local_mean)
    memory.step += 1
    assert not (memory.p if "alternate" in spec else memory.q)["w"].any()  # the factor this step left
    g = torch.Generator().manual_seed(5)
    grads = {w: [torch.randn(40, 30, generator=g)] for w in range(2)}
    out = p.average(memory, grads, ["w"], local_mean)[0]
    assert out.norm() > 0.1 * local_mean({w: t[0] for w, t in grads.items()}).norm()
    if "alternate" not in spec:
        fresh.step = 1
        assert torch.equal(out, p.average(fresh, grads, ["w"], local_mean)[0])


def test_alternate_needs_warm_start():
    with pytest.raises(ValueError, match="alternate=true needs warm_start=true"):
        AVERAGERS.build("powersgd:alternate=true,warm_start=false")
