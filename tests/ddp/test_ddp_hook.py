"""gradwire.ddp against plain DDP on 2 gloo processes (FileStore, spawn; results compared here).

The scenarios run in the children (one pair of processes for all, see ``suite``); each test checks
its scenario's results in the parent.

Buckets: ``bucket_cap_mb=0.004`` splits the 3.2k-parameter MLP into several DDP buckets, which DDP
rebuilds (in another order) after the first step, so every test also crosses a rebuild.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire import ddp as gwddp
from gradwire.compress import build
from gradwire.errors import CommunicationError, ConfigError, DivergenceError
from tests.ddp.ddp_harness import (
    batch,
    full_loss,
    launch,
    make_data,
    make_model,
    params,
    part,
    poison,
    resume_twice,
    run_scenarios,
    train,
)

SMALL_BUCKETS = 0.004  # MB


# --- scenarios (run in the children) ----------------------------------------------------------

# exactly lossless codecs whose sizes depend on the data: the gathered path (sizes first, then the
# payloads, decoded and averaged here), with every parameter compressed
LOSSLESS = ("topk:ratio=1", "threshold:tau=0")


def same_as_plain(rank, world_size, steps):
    x, y = make_data(rank, world_size)
    out = {}
    for cap in (25, SMALL_BUCKETS):
        for spec in ("plain", "none", "fp16", *LOSSLESS):
            model = DDP(make_model(), bucket_cap_mb=cap)
            if spec in LOSSLESS:
                gwddp.register(model, spec, min_compress_numel=0)
            elif spec != "plain":
                gwddp.register(model, spec)
            train(model, x, y, 0, steps)
            out[f"{spec}@{cap}"] = params(model)
    return out


def own_storage(rank, world_size, steps):
    """Whether each future of the hook with ``none`` (and, to show the check can fail, ``fp16``)
    hands DDP back the bucket's own storage."""
    x, y = make_data(rank, world_size)
    out = {}
    for spec in ("none", "fp16"):
        model = DDP(make_model(), bucket_cap_mb=SMALL_BUCKETS)
        state = gwddp.HookState(model, spec)
        same = []

        def recording_hook(state, bucket, same=same):
            pointer = bucket.buffer().data_ptr()
            return gwddp.hook(state, bucket).then(lambda f: same.append(f.value().data_ptr() == pointer) or f.value())

        model.register_comm_hook(state, recording_hook)
        train(model, x, y, 0, steps)
        out[spec] = same
    return out


# (spec, error feedback, min_compress_numel): qsgd compresses every parameter, the others leave
# the biases (< 1024 elements) raw, the default
SPECS = [("none", False, 1024), ("qsgd:levels=4", False, 0), ("topk:ratio=0.1", True, 1024),
         ("threshold:tau=0.01", True, 1024)]


def converge(rank, world_size, steps):
    x, y = make_data(rank, world_size)
    out = {}
    for spec, ef, smallest in SPECS:
        model = DDP(make_model(), bucket_cap_mb=SMALL_BUCKETS)
        state = gwddp.register(model, spec, error_feedback=ef, seed=7, min_compress_numel=smallest)
        start = full_loss(model, x, y)
        train(model, x, y, 0, steps)
        out[spec] = {"start": start, "end": full_loss(model, x, y), "params": params(model),
                     "state": state.state_dict()}
    return out


def resume(rank, world_size, folder, first, then):
    x, y = make_data(rank, world_size)
    out = {}
    for spec in ("topk:ratio=0.1", "qsgd:levels=4"):
        def fresh(seed=0, spec=spec):
            model = DDP(make_model(seed), bucket_cap_mb=SMALL_BUCKETS)
            return model, gwddp.register(model, spec, error_feedback=True, seed=3)

        model, state = fresh()
        train(model, x, y, 0, first + then)
        straight = params(model)

        model, state = fresh()
        opt = train(model, x, y, 0, first)
        path = f"{folder}/{spec[:4]}-{rank}.pt"
        ckpt = {"model": model.module.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}
        torch.save(ckpt, path)
        resumed = resume_twice(path, fresh, x, y, first, then)
        model, state = fresh(seed=99)  # a hook to try the other rank's state on
        torch.distributed.barrier()  # both checkpoints exist: try the other rank's
        try:
            state.load_state_dict(torch.load(f"{folder}/{spec[:4]}-{1 - rank}.pt", weights_only=True)["hook"])
            wrong = "loaded"
        except ConfigError as e:
            wrong = str(e)
        out[spec] = {"straight": straight, "resumed": resumed[True], "no_hook_state": resumed[False],
                     "wrong_rank": wrong}
    return out


# the four paths: allreduce (none), asynchronous fixed-size gather (qsgd), the same framed at a bound (topk),
# sizes-first gather (threshold)
NON_FINITE_SPECS = ("none", "qsgd:levels=4", "topk:ratio=0.1", "threshold:tau=0.01")


def non_finite(rank, world_size):
    x, y = make_data(rank, world_size)
    out = {}
    for spec in NON_FINITE_SPECS:
        model = DDP(make_model(), bucket_cap_mb=SMALL_BUCKETS)
        gwddp.register(model, spec, error_feedback=spec != "none")
        poison(model, rank)
        try:
            train(model, x, y, 0, 5)
            out[spec] = ("none", "")
        except Exception as e:  # noqa: BLE001 - the parent checks type and text
            out[spec] = (type(e).__name__, str(e))
    return out


def propagate(rank, world_size):
    """non_finite="propagate" with a GradScaler-like loop: a step whose gradients are not finite
    is skipped, and training goes on."""
    x, y = make_data(rank, world_size)
    out = {}
    for spec in NON_FINITE_SPECS:
        model = DDP(make_model(), bucket_cap_mb=SMALL_BUCKETS)
        gwddp.register(model, spec, error_feedback=spec != "none", non_finite="propagate")
        poison(model, rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        skipped, nan_grad = [], []
        for step in range(5):
            xb, yb = batch(x, y, step)
            opt.zero_grad()
            F.mse_loss(model(xb), yb).backward()
            if all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()):
                opt.step()
            else:
                skipped.append(step)
                nan_grad.append(bool(torch.isnan(model.module[2].weight.grad).all()))
        out[spec] = {"skipped": skipped, "params": params(model), "nan_grad": nan_grad}
    return out


def slow_peer(rank, world_size, folder):
    x, y = make_data(rank, world_size)
    model = DDP(make_model())
    state = gwddp.register(model, "threshold:tau=0.01")  # the sizes-first path: the hook itself waits
    train(model, x, y, 0, 2)  # past DDP's bucket rebuild, whose broadcast (not ours) would wait
    state.timeout_s = 1.0  # only the step under test: a loaded machine may start the ranks' warm-up 1 s apart
    done = Path(folder, "slow_peer-rank0-done")
    if rank == 1:  # the slow peer never joins this step's collectives: only rank 0's wait is tested
        # it stays (its connections open) until rank 0 has returned from its step, however late
        # rank 0 gets there: leaving earlier would show rank 0 a closed connection, not a timeout
        deadline = time.monotonic() + 60
        while not done.exists():
            if time.monotonic() > deadline:
                return ("TimeoutError", "rank 0 never finished its step")
            time.sleep(0.05)
        return ("none", "")
    try:
        train(model, x, y, 2, 1)
        return ("none", "")
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e))
    finally:
        done.touch()


STEPS = 150


def suite(rank, world_size, folder):
    """Every scenario in one pair of processes (spawning and DDP's first set-up cost ~5 s a pair),
    the ones that break the process group last; a scenario's failure is its test's failure only."""
    return run_scenarios([("same_as_plain", lambda: same_as_plain(rank, world_size, 8)),
                          ("own_storage", lambda: own_storage(rank, world_size, 3)),
                          ("converge", lambda: converge(rank, world_size, STEPS)),
                          ("resume", lambda: resume(rank, world_size, folder, 6, 6)),
                          ("non_finite", lambda: non_finite(rank, world_size)),
                          ("propagate", lambda: propagate(rank, world_size)),
                          ("slow_peer", lambda: slow_peer(rank, world_size, folder))])


# --- tests (the parent compares) --------------------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("ddp")


@pytest.fixture(scope="module")
def results(folder):
    return launch(suite, folder, str(folder), timeout_s=100)




def assert_equal_lists(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=0)


@pytest.mark.timeout(120)
def test_none_matches_plain_ddp(results):
    results = part(results, "same_as_plain")
    for out in results:
        for cap in (25, SMALL_BUCKETS):
            plain = out[f"plain@{cap}"]
            assert_equal_lists(out[f"none@{cap}"], plain)  # bit for bit, one bucket or several
            for half, full in zip(out[f"fp16@{cap}"], plain, strict=True):
                torch.testing.assert_close(half, full, rtol=2e-3, atol=2e-3)
            assert not torch.equal(out[f"fp16@{cap}"][0], plain[0])  # fp16 really went through fp16
    assert_equal_lists(results[0][f"none@{SMALL_BUCKETS}"], results[1][f"none@{SMALL_BUCKETS}"])


@pytest.mark.timeout(120)
def test_lossless_codecs_on_the_gathered_path_equal_plain_ddp(results):
    """Top-k keeping every element and a threshold of 0 send the gradients exactly: the averaged
    gradient, hence every parameter, must be plain DDP's (the mean of the ranks, not their sum)."""
    results = part(results, "same_as_plain")
    for out in results:
        for cap in (25, SMALL_BUCKETS):
            plain = out[f"plain@{cap}"]
            assert not any(torch.equal(a, b) for a, b in zip(make_model().parameters(), plain, strict=True))
            for spec in LOSSLESS:
                for a, b in zip(out[f"{spec}@{cap}"], plain, strict=True):
                    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.timeout(120)
def test_lossy_compressors_converge_and_ranks_agree(results):
    trained = part(results, "converge")
    for spec, *_ in SPECS:
        start = sum(out[spec]["start"] for out in trained) / 2
        end = sum(out[spec]["end"] for out in trained) / 2
        assert end < 0.05 and end < 0.1 * start, (spec, start, end)
        assert_equal_lists(trained[0][spec]["params"], trained[1][spec]["params"])  # bit-identical steps
    plain = sum(out["none"]["end"] for out in trained) / 2
    for spec in ("qsgd:levels=4", "topk:ratio=0.1"):
        assert sum(out[spec]["end"] for out in trained) / 2 < 3 * plain + 0.01, spec


@pytest.mark.timeout(120)
def test_byte_counts_follow_the_rule(results):
    trained = part(results, "converge")
    numels = [p.numel() for p in make_model().parameters()]
    for spec, _, smallest in SPECS[:2]:  # fixed-size payloads
        per_step = sum(build(spec).nbytes(n) if n >= smallest else 4 * n for n in numels)
        assert spec == "none" or per_step < sum(numels)  # under 8 bits per element: compression happened
        for out in trained:
            state = out[spec]["state"]
            assert state["step"] == STEPS
            # payload bytes of this rank, times the one peer each reaches
            assert state["bytes_sent"] == STEPS * per_step * 1, spec
            # fixed-size codecs: one status byte per bucket, no sizes, no padding
            status = state["wire_bytes_sent"] - STEPS * per_step
            if spec == "none":
                assert status == 0
            else:  # SMALL_BUCKETS splits the model into 2 buckets (1 before DDP's rebuild after step 1)
                assert status == 2 * STEPS - 1, (spec, status)
    assert 4 * sum(numels) == sum(build("none").nbytes(n) for n in numels)
    # threshold's sizes depend on the data, unbounded: payload <= wire, and wire covers the sizes and padding
    for out in trained:
        state = out["threshold:tau=0.01"]["state"]
        assert 0 < state["bytes_sent"] <= state["wire_bytes_sent"] - STEPS * 8 * len(numels)
    # topk's depend on the data within a bound: every compressed parameter framed at it (4-byte length,
    # zeros up to k values and the largest section of k positions), a status byte per bucket, no sizes
    topk = build("topk:ratio=0.1")
    framed = sum(topk.max_nbytes(n) + 4 if n >= 1024 else 4 * n for n in numels)
    for out in trained:
        state = out["topk:ratio=0.1"]["state"]
        assert state["wire_bytes_sent"] - STEPS * framed == 2 * STEPS - 1  # the buckets' status bytes
        assert state["bytes_sent"] < STEPS * framed
    # topk: the k values of each compressed parameter, and positions no larger than a bitmap
    topk = build("topk:ratio=0.1")
    values = sum(4 * topk.count(n) if n >= 1024 else 4 * n for n in numels)
    bitmaps = sum(-(-n // 8) for n in numels if n >= 1024)
    for out in trained:
        assert values < out["topk:ratio=0.1"]["state"]["bytes_sent"] / STEPS <= values + bitmaps


@pytest.mark.timeout(120)
def test_state_dict_resume_equals_not_stopping(results, folder):
    for rank, out in enumerate(part(results, "resume")):
        for spec, r in out.items():
            assert_equal_lists(r["resumed"], r["straight"])
            pairs = zip(r["no_hook_state"], r["straight"], strict=True)
            # else the test would prove nothing
            assert any(not torch.equal(a, b) for a, b in pairs), f"{spec}: no hook state, same result"
            assert f"rank={1 - rank}" in r["wrong_rank"], r["wrong_rank"]
    # the checkpoint is plain data
    state = torch.load(folder / "topk-0.pt", weights_only=True)["hook"]
    assert state["compressor"] == "topk:ratio=0.1" and state["step"] == 6
    # residuals of the compressed parameters only (the others, under 1024 elements, travel raw)
    assert sorted(state["residuals"]) == ["0.weight", "2.weight"]


@pytest.mark.timeout(120)
def test_none_hands_back_the_bucket_storage(results):
    """With ``none`` the hook is one in-place allreduce: no copy of the bucket in or out."""
    for rank in part(results, "own_storage"):
        assert len(rank["none"]) >= 3 and all(rank["none"]), rank["none"]
        assert not any(rank["fp16"])  # a cast cannot: it decodes into a new tensor


@pytest.mark.timeout(120)
def test_non_finite_gradient_stops_every_rank_naming_the_bucket(results):
    results = part(results, "non_finite")
    for spec in NON_FINITE_SPECS:
        (kind0, text0), (kind1, text1) = results[0][spec], results[1][spec]
        assert "rank 1, bucket" in text1 and "'2.weight'" in text1 and "nan" in text1, text1
        assert "step 2" in text1 and spec.split(":")[0] in text1, text1
        assert "every rank stops" in text0 and "bucket" in text0, text0
        if spec.startswith("threshold"):  # raised by the hook itself; the asynchronous paths via DDP's future
            assert kind0 == kind1 == "DivergenceError"


@pytest.mark.timeout(120)
def test_non_finite_propagate_gives_every_rank_nan_and_training_goes_on(results):
    ranks = part(results, "propagate")
    for spec in NON_FINITE_SPECS:
        first, second = ranks[0][spec], ranks[1][spec]
        assert first["skipped"] == second["skipped"] == [2], spec  # both ranks saw the NaN at step 2
        assert first["nan_grad"] == second["nan_grad"] == [True], spec  # all of 2.weight, not one element
        for a, b in zip(first["params"], second["params"], strict=True):
            assert bool(torch.isfinite(a).all())
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.timeout(120)
def test_timeout_raises_instead_of_hanging(results):
    kind, text = part(results, "slow_peer")[0]
    assert kind == "CommunicationError" and "bucket 0" in text, text
    # timeout_s is the limit here (the group's is gloo's 30 minutes), and the message says which it was
    assert "all-gather of payload sizes failed or took longer than timeout_s=1 s: " in text, text


def test_bad_input_is_rejected_before_any_communication():
    with pytest.raises(ConfigError, match="valid compressors are .*qsgd.*; averagers: powersgd"):
        gwddp.HookState(make_model(), "qsgdd")
    with pytest.raises(ConfigError, match="valid parameters: levels, bucket"):
        gwddp.HookState(make_model(), "qsgd:levles=4")
    with pytest.raises(ConfigError, match="non_finite='ignore': valid choices are raise, propagate"):
        gwddp.HookState(make_model(), "none", non_finite="ignore")
    with pytest.raises(ConfigError, match="timeout_s"):
        gwddp.HookState(make_model(), "none", timeout_s=0)
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        gwddp.register(make_model(), "none")
    assert issubclass(DivergenceError, RuntimeError) and issubclass(CommunicationError, RuntimeError)
