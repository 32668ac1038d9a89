"""gradwire.ddp at its edges: DDP's find_unused_parameters, a mean that leaves a 16-bit wire's range,
GradScaler and error feedback, residuals across a skipped step, exact byte counts, bad settings.

In-process tests use a world of one gloo rank (FileStore, no port); the 2-rank scenarios run in one
pair of processes (``suite``), the parent compares.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gradwire import ddp as gwddp
from gradwire.compress import build
from gradwire.errors import ConfigError
from tests.ddp.conftest import destroy_default_group
from tests.ddp.ddp_harness import batch, launch, make_data, make_model, params, part, poison, run_scenarios, train

SMALL_BUCKETS = 0.004  # MB: several buckets
ONE_BUCKET = 25  # MB: the whole MLP in one bucket


# --- scenarios (run in the children) ----------------------------------------------------------

def fp16_overflow(rank, world_size):
    """Each rank's gradient is 1e5 (its share 5e4 fits fp16), the mean 1e5 does not."""
    model = DDP(nn.Linear(4, 1, bias=False))
    gwddp.register(model, "fp16", non_finite="raise")
    try:
        # through DDP's forward (which prepares its reducer), the gradient 1e5 on every rank
        ((model(torch.ones(1, 4)) * 0).sum() + (model.module.weight * 1e5).sum()).backward()
        return ("none", str(model.module.weight.grad.tolist()))
    except Exception as e:  # noqa: BLE001 - the parent checks type and text
        return (type(e).__name__, str(e))


def propagate_keeps_residuals(rank, world_size):
    """non_finite="propagate": rank 1's gradient turns NaN at step 2; the residuals (every rank's)
    after that step must be those before it. One path each: sizes-first (threshold), fixed-size (qsgd),
    fixed-size framed at a bound (topk), allreduce of a cast (fp16 with error feedback)."""
    x, y = make_data(rank, world_size)
    out = {}
    for spec in ("threshold:tau=0.01", "qsgd:levels=4", "topk:ratio=0.1", "fp16"):
        model = DDP(make_model(), bucket_cap_mb=SMALL_BUCKETS)
        state = gwddp.register(model, spec, error_feedback=True, non_finite="propagate", min_compress_numel=0)
        poison(model, rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        steps = []
        for step in range(4):
            before = state.state_dict()["residuals"]
            xb, yb = batch(x, y, step)
            opt.zero_grad()
            F.mse_loss(model(xb), yb).backward()
            finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
            if finite:
                opt.step()
            steps.append({"finite": finite, "before": before, "after": state.state_dict()["residuals"]})
        out[spec] = steps
    return out


def failed_bucket_bytes(rank, world_size):
    """One bucket on the sizes-first path (threshold), propagate: the step whose bucket fails still
    all-gathered its sizes (8 bytes per parameter): the counters' increase over that step."""
    x, y = make_data(rank, world_size)
    model = DDP(make_model(), bucket_cap_mb=ONE_BUCKET)
    state = gwddp.register(model, "threshold:tau=0.01", non_finite="propagate", min_compress_numel=0)
    poison(model, rank)
    deltas = []
    for step in range(3):
        before = (state.bytes_sent, state.wire_bytes_sent)
        xb, yb = batch(x, y, step)
        model.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        deltas.append((state.bytes_sent - before[0], state.wire_bytes_sent - before[1]))
    return deltas


def exact_bytes(rank, world_size, steps):
    """Per step, this rank's payload bytes and wire bytes, one bucket, for the two codecs whose sizes
    depend on the data: topk framed at its bound (one all-gather), threshold sizes first (an
    all-gather of sizes, then one of padded payloads)."""
    x, y = make_data(rank, world_size)
    return {spec: bytes_per_step(spec, x, y, steps, error_feedback=True, min_compress_numel=0)
            for spec in ("topk:ratio=0.1", "threshold:tau=0.01")}


def bytes_per_step(spec: str, x, y, steps: int, **register) -> list[tuple[int, int]]:
    """This rank's (payload, wire) bytes in each of ``steps`` steps of a one-bucket model trained with
    ``spec`` (``register``: the hook's other settings)."""
    model = DDP(make_model(), bucket_cap_mb=ONE_BUCKET)
    state = gwddp.register(model, spec, **register)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rows = []
    for step in range(steps):
        before = (state.bytes_sent, state.wire_bytes_sent)
        train(model, x, y, step, 1, opt)
        rows.append((state.bytes_sent - before[0], state.wire_bytes_sent - before[1]))
    return rows


def cast_bytes(rank, world_size, steps):
    """Per step, this rank's (payload, wire) bytes on the allreduce paths: the summable casts, none
    with error feedback (the encoded bucket's allreduce), none without (in place)."""
    x, y = make_data(rank, world_size)
    return {f"{spec}{'+ef' if ef else ''}": bytes_per_step(spec, x, y, steps, error_feedback=ef)
            for spec, ef in (("fp16", False), ("bf16", True), ("none", True), ("none", False))}


def draws(rank, world_size):
    """qsgd's packets of one and the same tensor on each rank, at steps 0 and 1: the random draws
    depend on the rank and the step."""
    model = DDP(make_model(), bucket_cap_mb=ONE_BUCKET)
    state = gwddp.HookState(model, "qsgd:levels=4", seed=5, min_compress_numel=0)
    grad = torch.linspace(-1.0, 1.0, 16 * 64)
    packets = []
    for step in (0, 1):
        state.step = step
        packets.append(gwddp._encode(state, grad, 0, "0.weight").buffer.clone())
    return packets


def resume_counters(rank, world_size, folder):
    """topk with error feedback, 6 steps straight, and 3 + 3 through a state_dict: the counters."""
    x, y = make_data(rank, world_size)

    def fresh():
        model = DDP(make_model(), bucket_cap_mb=ONE_BUCKET)
        return model, gwddp.register(model, "topk:ratio=0.1", error_feedback=True, min_compress_numel=0)

    model, state = fresh()
    train(model, x, y, 0, 6)
    straight = (state.bytes_sent, state.wire_bytes_sent)
    model, state = fresh()
    opt = train(model, x, y, 0, 3)
    saved = {"model": model.module.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}
    torch.save(saved, f"{folder}/counters-{rank}.pt")
    model, state = fresh()
    saved = torch.load(f"{folder}/counters-{rank}.pt", weights_only=True)
    model.module.load_state_dict(saved["model"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt.load_state_dict(saved["opt"])
    state.load_state_dict(saved["hook"])
    train(model, x, y, 3, 3, opt)
    return {"straight": straight, "resumed": (state.bytes_sent, state.wire_bytes_sent)}


class Sometimes(nn.Module):
    """An MLP whose second layer is used only when asked (DDP's find_unused_parameters case)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.side, self.out = nn.Linear(16, 64), nn.Linear(16, 64), nn.Linear(64, 1)

    def forward(self, x, use: bool):
        h = torch.tanh(self.a(x))
        return self.out(h + torch.tanh(self.side(x)) if use else h)


def powersgd_unused(rank, world_size):
    """powersgd (no error memory, which find_unused_parameters refuses) with find_unused_parameters:
    rank 0's communication thread is slowed before each collective, as under load, so that without
    the last bucket's wait DDP's own allreduce of the used parameters would overtake the hook's."""
    real = dist.all_reduce

    def slowed(*args, **kwargs):
        import threading
        import time

        if rank == 0 and threading.current_thread().name.startswith("gradwire"):
            time.sleep(0.05)  # a slow thread, not a bound on anything: the test measures no time
        return real(*args, **kwargs)

    dist.all_reduce = slowed
    try:
        model = DDP(Sometimes(), bucket_cap_mb=0.004, find_unused_parameters=True)
        state = gwddp.register(model, "powersgd:rank=2,error_feedback=false", timeout_s=20)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        for step in range(6):
            xb, yb = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
            opt.zero_grad()
            F.mse_loss(model(xb, step % 2 == 0), yb).backward()
            opt.step()
        return {"params": params(model), "step": state.step}
    finally:
        dist.all_reduce = real


EXACT_STEPS = 6


def suite(rank, world_size, folder):
    # (powersgd_unused has a pair of processes of its own: a hook that gets the order of the
    # collectives wrong makes gloo abort the process)
    return run_scenarios([("fp16_overflow", lambda: fp16_overflow(rank, world_size)),
                          ("propagate_keeps_residuals", lambda: propagate_keeps_residuals(rank, world_size)),
                          ("failed_bucket_bytes", lambda: failed_bucket_bytes(rank, world_size)),
                          ("exact_bytes", lambda: exact_bytes(rank, world_size, EXACT_STEPS)),
                          ("cast_bytes", lambda: cast_bytes(rank, world_size, 2)),
                          ("draws", lambda: draws(rank, world_size)),
                          ("resume_counters", lambda: resume_counters(rank, world_size, folder))])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp-edges")
    return launch(suite, folder, str(folder), timeout_s=150)


# --- 2-rank tests (the parent compares) -------------------------------------------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_powersgd_with_find_unused_parameters_issues_collectives_in_one_order(tmp_path):
    """DDP allreduces its map of used parameters once the last bucket's hook has returned; the
    hook's own collectives run on its communication thread. Every rank must issue them in one order
    (else gloo reports a collective mismatch, or aborts)."""
    ranks = launch(powersgd_unused, tmp_path, timeout_s=150)
    assert ranks[0]["step"] == ranks[1]["step"] == 6
    for a, b in zip(ranks[0]["params"], ranks[1]["params"], strict=True):
        assert bool(torch.isfinite(a).all())
        assert torch.equal(a, b)


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_a_mean_beyond_fp16s_range_raises_naming_step_and_bucket(results):
    for rank, (kind, text) in enumerate(part(results, "fp16_overflow")):
        assert "DivergenceError" in kind + text, (kind, text)  # through DDP's future: a RuntimeError quoting it
        assert f"step 0, rank {rank}, bucket 0" in text and "not finite" in text, text


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_propagate_leaves_every_ranks_residuals_as_they_were_across_a_skipped_step(results):
    for rank, out in enumerate(part(results, "propagate_keeps_residuals")):
        for spec, steps in out.items():
            assert [s["finite"] for s in steps] == [True, True, False, True], (spec, rank)
            skipped = steps[2]
            assert sorted(skipped["after"]) == sorted(skipped["before"]), (spec, rank)
            for name, residual in skipped["before"].items():
                assert torch.equal(skipped["after"][name], residual), (spec, rank, name)
            # the residuals do change on a step that is not skipped (else this would prove nothing)
            changed = steps[3]
            assert any(not torch.equal(changed["after"][n], r) for n, r in changed["before"].items()), spec


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_a_failed_sizes_first_bucket_counts_the_sizes_it_sent(results):
    parameters = len(list(make_model().parameters()))
    for deltas in part(results, "failed_bucket_bytes"):
        assert deltas[0][0] > 0 and deltas[1][0] > 0  # the good steps sent payloads
        # step 2 failed: no payload, but the int64 size of each parameter went to the one peer
        assert deltas[2] == (0, 8 * parameters), deltas


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_wire_bytes_of_the_data_dependent_sizes_framed_or_sizes_first(results):
    """Per step (one bucket, world size 2, so each rank's bytes reach one peer). threshold (no
    bound): 8 bytes per parameter for the sizes, then every rank sends the longest rank's payload
    length (padding). topk (bounded): a status byte, then every parameter framed at its bound (a
    4-byte length, zeros up to k values and the largest section of k positions), whatever the
    payloads' own lengths."""
    parameters = list(make_model().parameters())
    topk = build("topk:ratio=0.1")
    ranks = part(results, "exact_bytes")
    for spec in ("topk:ratio=0.1", "threshold:tau=0.01"):
        payload = [[p for p, _ in out[spec]] for out in ranks]
        assert len(payload[0]) == EXACT_STEPS
        # the ranks' payloads differ in length on some step, so that padding is really tested
        assert any(a != b for a, b in zip(*payload, strict=True)), spec
        for out in ranks:
            for step, (_, wire) in enumerate(out[spec]):
                if spec.startswith("topk"):
                    assert wire == 1 + sum(topk.max_nbytes(p.numel()) + 4 for p in parameters), step
                else:
                    assert wire == 8 * len(parameters) + max(payload[0][step], payload[1][step]), (spec, step)


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_the_allreduce_paths_count_the_bytes_of_their_wire_dtype(results):
    """World size 2: each rank's bucket reaches one peer, in the dtype that travels: 2 bytes per
    element for fp16 and bf16 (not the float32 gradients' 4), 4 for none; payload and wire alike."""
    numel = sum(p.numel() for p in make_model().parameters())
    expected = {"fp16": 2 * numel, "bf16+ef": 2 * numel, "none+ef": 4 * numel, "none": 4 * numel}
    for out in part(results, "cast_bytes"):
        assert out == {spec: [(n, n)] * 2 for spec, n in expected.items()}


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_random_draws_differ_between_ranks_and_between_steps(results):
    (r0_step0, r0_step1), (r1_step0, r1_step1) = part(results, "draws")
    assert not torch.equal(r0_step0, r1_step0)  # same gradient, same step, other rank: other draws
    assert not torch.equal(r0_step0, r0_step1) and not torch.equal(r1_step0, r1_step1)  # other step


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
def test_byte_counters_after_resuming_equal_the_straight_runs(results):
    for out in part(results, "resume_counters"):
        assert out["straight"][0] > 0
        assert out["resumed"] == out["straight"], out


# --- in-process tests -------------------------------------------------------------------------

class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x) + self.b(x)


@pytest.mark.timeout(60)
def test_error_feedback_with_find_unused_parameters_is_refused(one_rank):
    model = DDP(Pair(), find_unused_parameters=True)
    with pytest.raises(ConfigError, match=r"error feedback .*find_unused_parameters=True.*would be lost"):
        gwddp.register(model, "topk:ratio=0.1", error_feedback=True)
    with pytest.raises(ConfigError, match=r"error feedback \(powersgd.*find_unused_parameters=True"):
        gwddp.register(DDP(Pair(), find_unused_parameters=True), "powersgd:rank=1")  # its own, on by default
    # without error feedback, or without find_unused_parameters, accepted
    gwddp.register(DDP(Pair(), find_unused_parameters=True), "topk:ratio=0.1")
    gwddp.register(DDP(Pair(), find_unused_parameters=True), "powersgd:rank=1,error_feedback=false")
    gwddp.register(DDP(Pair()), "topk:ratio=0.1", error_feedback=True)


@pytest.mark.timeout(60)
def test_grad_scaler_keeps_residuals_unscaled_across_a_scale_change(one_rank):
    """topk with error feedback under a GradScaler whose scale goes 1024 -> 512: what was applied
    (unscaled) plus the residual left equals the true gradients summed. The scales are powers of two,
    so scaling the loss scales every gradient exactly; only the additions round."""
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    results = {}
    for scaler in (None, torch.amp.GradScaler("cpu", init_scale=1024.0)):
        torch.manual_seed(0)
        model = DDP(nn.Linear(64, 64, bias=False))
        reference = torch.amp.GradScaler("cpu", init_scale=1024.0)
        state = gwddp.register(model, "topk:ratio=0.1", error_feedback=True, grad_scaler=scaler)
        applied, true = torch.zeros(64 * 64), torch.zeros(64 * 64)
        for scale in (1024.0, 512.0):
            used = scaler or reference
            if scale != 1024.0:  # the scaler's own way to a new scale (after an overflow: halved)
                used.update(new_scale=scale)
            model.zero_grad()
            used.scale(model(x).pow(2).mean()).backward()
            assert used.get_scale() == scale
            applied += model.module.weight.grad.reshape(-1) / scale  # what GradScaler's unscale gives
            w = model.module.weight.detach().clone().requires_grad_()
            (x @ w.T).pow(2).mean().backward()
            true += w.grad.reshape(-1)
        residual = state.error_feedback.residuals["weight"]
        results[scaler is not None] = (applied, residual, true)
    applied, residual, true = results[True]
    torch.testing.assert_close(applied + residual, true, rtol=1e-5, atol=1e-6 * float(true.abs().max()))
    # without the scaler the residual is in the last step's scaled units: the same check fails
    applied, residual, true = results[False]
    assert float((applied + residual / 512.0 - true).norm() / true.norm()) > 1e-2


@pytest.mark.timeout(60)
def test_grad_scaler_is_refused_with_powersgds_own_error_memory(one_rank):
    with pytest.raises(ConfigError, match="grad_scaler= does not combine with powersgd"):
        gwddp.register(DDP(Pair()), "powersgd:rank=1", grad_scaler=torch.amp.GradScaler("cpu"))


@pytest.mark.timeout(60)
def test_min_compress_numel_is_saved_and_a_different_one_refused_on_load(one_rank):
    saved = gwddp.HookState(make_model(), "topk:ratio=0.1", min_compress_numel=0).state_dict()
    assert saved["min_compress_numel"] == 0
    with pytest.raises(ConfigError, match=r"min_compress_numel=0, this hook has 1024"):
        gwddp.HookState(make_model(), "topk:ratio=0.1").load_state_dict(saved)
    gwddp.HookState(make_model(), "topk:ratio=0.1", min_compress_numel=0).load_state_dict(saved)


@pytest.mark.timeout(60)
def test_load_state_dict_refuses_another_world_size_and_residuals_that_do_not_fit(one_rank):
    """Residuals belong to one rank of one configuration: a state saved at another world size, or
    with error feedback off, or holding a residual of the wrong size or for an unknown parameter,
    is refused whole (ConfigError naming it), and the hook keeps what it had."""
    state = gwddp.HookState(make_model(), "topk:ratio=0.1", error_feedback=True)
    saved = state.state_dict()
    name, numel = next((n, k) for _, n, k in state._params.values())
    residual = torch.ones(numel)
    cases = [
        (dict(saved, world_size=2), r"saved with world_size=2, this hook has 1"),
        (dict(saved, error_feedback=False), r"saved with error_feedback=False, this hook has True"),
        (dict(saved, residuals={name: torch.ones(numel + 1)}), rf"of the wrong size: \['{name}'\]"),
        (dict(saved, residuals={name: residual, "nope.weight": residual}), r"unknown parameters .*'nope.weight'"),
    ]
    for bad, named in cases:
        with pytest.raises(ConfigError, match=named):
            state.load_state_dict(bad)
        assert state.error_feedback.residuals == {}
    state.load_state_dict(dict(saved, residuals={name: residual}))  # a fitting one loads
    assert torch.equal(state.error_feedback.residuals[name], residual)


@pytest.mark.timeout(60)
def test_propagate_a_skipped_step_whose_first_bucket_travels_raw_keeps_the_last_steps_residuals(one_rank):
    """non_finite="propagate", error feedback: at step 2 the last layer's gradient (all of it below
    min_compress_numel, so its bucket, the first DDP hands over, travels raw and encodes nothing
    through the codec) turns NaN. The step is skipped, and the residuals after it are those after
    step 1: not those before step 1, which the hook still kept from that pass."""
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 4)), bucket_cap_mb=SMALL_BUCKETS)
    state = gwddp.register(model, "topk:ratio=0.1", error_feedback=True, non_finite="propagate")
    calls = {"n": 0}

    def nan_at_step_2(grad):
        calls["n"] += 1
        return torch.full_like(grad, float("nan")) if calls["n"] == 3 else grad

    model.module[1].bias.register_hook(nan_at_step_2)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    residuals = []
    for _ in range(3):
        model.zero_grad()
        model(x).pow(2).mean().backward()
        residuals.append({k: v.clone() for k, v in state.error_feedback.residuals.items()})
    assert not bool(torch.isfinite(model.module[0].weight.grad).any())  # step 2: NaN everywhere, skipped
    assert list(residuals[2]) == ["0.weight"]  # the one compressed parameter
    assert not torch.equal(residuals[1]["0.weight"], residuals[0]["0.weight"])
    assert torch.equal(residuals[2]["0.weight"], residuals[1]["0.weight"])


@pytest.mark.timeout(60)
def test_load_state_dict_brings_the_saved_runs_seed_and_step_so_the_draws_go_on_alike(one_rank):
    """A hook built with another seed takes the saved run's seed and step: its next random draws
    (qsgd's stochastic rounding) are the saved run's."""
    saved_run = gwddp.HookState(make_model(), "qsgd:levels=4", seed=5)
    saved_run.step = 7
    fresh = gwddp.HookState(make_model(), "qsgd:levels=4", seed=0)
    fresh.load_state_dict(saved_run.state_dict())
    assert (fresh.seed, fresh.step) == (5, 7)
    grad = torch.randn(4096, generator=torch.Generator().manual_seed(2))
    index, name, _ = next(iter(saved_run._params.values()))
    expected = gwddp._encode(saved_run, grad, index, name).buffer
    assert torch.equal(gwddp._encode(fresh, grad, index, name).buffer, expected)


@pytest.mark.timeout(60)
def test_load_state_dict_restores_the_byte_counters(one_rank):
    state = gwddp.HookState(make_model(), "qsgd:levels=4")
    saved = dict(state.state_dict(), bytes_sent=1234, wire_bytes_sent=1300)
    fresh = gwddp.HookState(make_model(), "qsgd:levels=4")
    fresh.load_state_dict(saved)
    assert (fresh.bytes_sent, fresh.wire_bytes_sent) == (1234, 1300)


BAD = [("compressor", 123, "compressor=123"), ("compressor", None, "compressor=None"),
       ("seed", "abc", "seed='abc'"), ("seed", 1.7, "seed=1.7"), ("seed", True, "seed=True"),
       ("error_feedback", "no", "error_feedback='no'"), ("error_feedback", 1, "error_feedback=1"),
       ("min_compress_numel", True, "min_compress_numel=True"),
       ("min_compress_numel", 1e3, "min_compress_numel=1000.0"), ("min_compress_numel", -1, "min_compress_numel=-1"),
       ("timeout_s", True, "timeout_s=True"), ("timeout_s", float("inf"), "timeout_s=inf"),
       ("grad_scaler", "yes", "grad_scaler='yes'")]


@pytest.mark.parametrize(("argument", "value", "named"), BAD, ids=[b[2] for b in BAD])
def test_each_bad_setting_is_one_config_error_naming_it(argument, value, named):
    """Checked before any process group is asked for (none exists here): one line naming the
    argument, the value and what is valid."""
    with pytest.raises(ConfigError) as caught:
        gwddp.HookState(make_model(), **{"compressor": "qsgd:levels=4", argument: value})
    text = str(caught.value)
    assert "\n" not in text and text.startswith(named) and "valid" in text, text


@pytest.mark.parametrize("world", [3, 5, 6, 7])
def test_a_float64_bucket_is_divided_as_plain_ddp_divides_it(world):
    """Plain DDP multiplies a float64 gradient by the double 1/world_size (reducer.cpp's mul_out by a
    wrapped double scalar); a float32 reciprocal differs from it in the last bits where 1/world is
    inexact."""
    state = SimpleNamespace(world_size=world, reciprocal=torch.full((1,), 1.0 / world))
    x = torch.randn(10000, generator=torch.Generator().manual_seed(world), dtype=torch.float64)
    got = x.clone()
    assert gwddp._divide_checking(state, got) is True
    assert torch.equal(got, torch.mul(x, 1.0 / world))
    y = x.clone()
    y[7] = float("inf")
    assert gwddp._divide_checking(state, y) is False


@pytest.mark.timeout(60)
def test_a_payload_over_its_frame_stops_the_ranks_after_the_collective(one_rank, monkeypatch):
    """A framed payload larger than the codec's bound (a codec's error: max_nbytes too small) is
    refused before the all-gather, as a gradient the codec refuses: the rank sends status 1 and every
    rank stops after the collective, instead of one rank raising and the others waiting in it."""
    model = DDP(nn.Linear(64, 64))
    state = gwddp.register(model, "topk:ratio=0.1")
    monkeypatch.setattr(type(state.compressor), "max_nbytes", lambda self, numel, dtype=torch.float32: 8)
    with pytest.raises(Exception, match=r"does not fit its frame of 8") as raised:
        model(torch.randn(4, 64)).sum().backward()
    assert "bucket 0" in str(raised.value)


@pytest.mark.timeout(60)
def test_framed_topk_on_one_rank_gives_its_own_decoded_topk_on_the_device(tmp_path, device):
    """The framed top-k path end to end on the device (gloo on the CPU, NCCL on a GPU; one rank): the
    gradient DDP applies is the decode of this rank's own top-k (the compressed weight) and the raw
    bias, so framing, the status byte and unframing lose nothing."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        module = nn.Linear(64, 64).to(device)
        reference = nn.Linear(64, 64).to(device)
        reference.load_state_dict(module.state_dict())
        model = DDP(module, device_ids=[device.index or 0] if device.type == "cuda" else None)
        state = gwddp.register(model, "topk:ratio=0.1")
        x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1)).to(device)
        model(x).sum().backward()
        reference(x).sum().backward()
        topk = build("topk:ratio=0.1")
        expected = topk.decode(topk.encode(reference.weight.grad.flatten())).view(64, 64)
        assert torch.equal(module.weight.grad, expected) and int((expected != 0).sum()) == topk.count(4096)
        assert torch.equal(module.bias.grad, reference.bias.grad)  # 64 elements: raw
        assert state.bytes_sent == 0  # one rank reaches no peer
        assert state.wire_bytes_sent == 0
    finally:
        destroy_default_group()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("module", [torch.nn.EmbeddingBag(50, 8, sparse=True), torch.nn.Embedding(50, 8, sparse=True)])
def test_a_model_with_sparse_gradients_is_refused_when_the_hook_is_registered(one_rank, module):
    """Sparse gradients (an embedding with sparse=True) are not averaged by the hook's dense paths:
    refused in one line at register (every compressor crashed deep in torch at the first backward)."""
    model = DDP(torch.nn.Sequential(module, torch.nn.Linear(8, 2)))
    with pytest.raises(ConfigError, match=r"module '0' has sparse gradients \(sparse=True\).*sparse=False"):
        gwddp.register(model, "none")
    dense = DDP(torch.nn.Sequential(torch.nn.EmbeddingBag(50, 8), torch.nn.Linear(8, 2)))
    gwddp.register(dense, "fp16")  # the same layer with dense gradients is taken
    frozen = torch.nn.EmbeddingBag(50, 8, sparse=True).requires_grad_(False)  # a frozen pretrained table
    model = DDP(torch.nn.Sequential(frozen, torch.nn.Linear(8, 2)))
    gwddp.register(model, "fp16")  # has no gradient: taken, and it trains
    model(torch.randint(0, 50, (4, 3))).sum().backward()
    assert model.module[1].weight.grad is not None
