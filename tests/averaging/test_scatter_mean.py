"""The compressed mean's scatter route (``--compressed-mean scatter``, averaging/compressed.py): the
mean taken by its chunks' owners with error feedback on both sides (Tang et al. 2019, 2021). Its
numbers against a reference written from the papers' rule, its bytes and time on the simulator
against the ledger's and the network model's formulas, the owners' residuals kept only when a round
is delivered (so a resumed round repeats it), the threads backend equal to the simulator, and the
combinations it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gradwire.averaging.compressed import CompressedMean
from gradwire.compress import build
from gradwire.errors import ConfigError
from gradwire.run.combination import check_combination
from gradwire.run.loop import Run
from gradwire.transports import ledger
from gradwire.transports.clocks import SimClock
from gradwire.transports.network import HalvingDoublingNetwork, PSNetwork, RingNetwork
from gradwire.transports.sim import SimTransport
from tests.algorithms.test_diloco import resume_mid_run
from tests.backends.threads import run_one_worker_per_thread

ROOT = Path(__file__).resolve().parents[2]


def scatter_mean(n: int, compressor: str = "sign:scaled=true", error_feedback: bool = True,
                 device: torch.device | str = "cpu", owner: str = "") -> CompressedMean:
    return CompressedMean(build(compressor), {r: torch.Generator(device=device).manual_seed(r) for r in range(n)},
                          error_feedback=error_feedback, route="scatter", world_size=n,
                          owner_generator=lambda r: torch.Generator(device=device).manual_seed(100 + r),
                          owner_compressor=build(owner) if owner else None)


def scaled_sign(v: torch.Tensor) -> torch.Tensor:
    """EF-signSGD's message (Karimireddy et al. 2019): sign(v) times mean |v| (sign(0) sent as +)."""
    return torch.where(v >= 0, 1.0, -1.0) * v.abs().mean()


def reference_rounds(xs: list[dict[int, torch.Tensor]], n: int, owner=scaled_sign) -> list[torch.Tensor]:
    """The rule written from the papers, chunk by chunk (tensor_split's chunks): each worker sends
    C(x_j + e_j) of chunk j and keeps e_j the rest; owner j averages the n messages, sends C'(m + f)
    (``owner``: C' = C by default), keeps f the rest; the mean is the owners' messages, concatenated."""
    numel = next(iter(xs[0].values())).numel()
    chunks = [(int(c[0]), int(c[-1]) + 1) for c in torch.arange(numel).tensor_split(n)]
    device = next(iter(xs[0].values())).device
    worker_res = {(r, j): torch.zeros(b - a, device=device) for r in range(n) for j, (a, b) in enumerate(chunks)}
    owner_res = {j: torch.zeros(b - a, device=device) for j, (a, b) in enumerate(chunks)}
    out = []
    for x in xs:
        parts = []
        for j, (a, b) in enumerate(chunks):
            sent = []
            for r in range(n):
                corrected = x[r][a:b] + worker_res[(r, j)]
                sent.append(scaled_sign(corrected))
                worker_res[(r, j)] = corrected - sent[-1]
            total = sent[0].clone()
            for s in sent[1:]:
                total += s
            corrected = total / n + owner_res[j]
            parts.append(owner(corrected))
            owner_res[j] = corrected - parts[-1]
        out.append(torch.cat(parts))
    return out


@pytest.mark.parametrize("n, numel", [(4, 1003), (3, 64), (5, 7)])
def test_the_mean_is_the_papers_two_sided_error_feedback_rule(n, numel, device):
    """On the workers' device (a tensor's device decides where the work happens)."""
    g = torch.Generator(device=device).manual_seed(0)
    xs = [{r: torch.randn(numel, generator=g, device=device) for r in range(n)} for _ in range(5)]
    averager = scatter_mean(n, device=device)
    transport = SimTransport(n, RingNetwork(mbps=100, latency_ms=1), SimClock())
    got = [averager.mean(transport, x) for x in xs]
    assert all(m.device == xs[0][0].device for m in got)
    for k, (mine, theirs) in enumerate(zip(got, reference_rounds(xs, n), strict=True)):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7, msg=lambda m, k=k: f"round {k}: {m}")


@pytest.mark.parametrize("owner, rule", [("fp16", lambda v: v.half().float()), ("none", lambda v: v)])
def test_the_owners_codec_is_theirs_and_sets_the_second_exchange_s_slot(owner, rule, device):
    """``--owner-compressor``: the owners' chunk means travel in their own codec (a float16 cast, or
    exactly), the rule otherwise the papers'; the second all-to-all's slots are that codec's (251
    elements: 502 bytes in float16, 1004 in float32), counted by the ledger and timed after the first."""
    n, numel = 4, 1003
    g = torch.Generator(device=device).manual_seed(5)
    xs = [{r: torch.randn(numel, generator=g, device=device) for r in range(n)} for _ in range(4)]
    averager = scatter_mean(n, owner=owner, device=device)
    network = RingNetwork(mbps=10, latency_ms=1)
    transport = SimTransport(n, network, SimClock())
    got = [averager.mean(transport, x) for x in xs]
    # the chunks' scales are summed in another order than the reference's, a last float32 bit apart, which
    # can round an owner's float16 the other way: one float16 step (2^-10 of a value, 2^-17 near 0.01)
    # (sent exactly, the owners' means keep those bits where a 1-bit owner's sign absorbs them)
    tolerance = dict(rtol=2e-3, atol=1e-5) if owner == "fp16" else dict(rtol=1e-5, atol=1e-6)
    for k, (mine, theirs) in enumerate(zip(got, reference_rounds(xs, n, owner=rule), strict=True)):
        torch.testing.assert_close(mine, theirs, **tolerance, msg=lambda m, k=k: f"round {k}: {m}")
    second = {"fp16": 502, "none": 1004}[owner]
    assert averager.owned.slot_size(numel, torch.float32) == (second, False)
    assert transport.bytes_sent == 4 * (ledger.alltoall(36, n) + ledger.alltoall(second, n))
    one_round = network.alltoall(36, n).time_s + network.alltoall(second, n).time_s
    assert transport.clock.now == pytest.approx(4 * one_round, rel=1e-12)


def test_an_owners_codec_of_a_bound_travels_framed_at_its_own_slot():
    """A top-k owners' codec (a bound, not a size) travels framed at its bound in the second exchange
    while the workers' 1-bit slots stay unframed; top-k of every element sends the mean exactly, so its
    rounds equal the exact owners' (``none``), bit for bit."""
    n, numel = 3, 300
    x = [{r: torch.randn(numel, generator=torch.Generator().manual_seed(10 * k + r)) for r in range(n)}
         for k in range(3)]
    framed, exact = scatter_mean(n, owner="topk:ratio=1"), scatter_mean(n, owner="none")
    assert framed.slot_size(numel, torch.float32)[1] is False and framed.owned.slot_size(numel, torch.float32)[1]
    t1, t2 = SimTransport(n, RingNetwork(), SimClock()), SimTransport(n, RingNetwork(), SimClock())
    for xk in x:
        assert torch.equal(framed.mean(t1, xk), exact.mean(t2, xk))
    second = framed.owned.slot_size(numel, torch.float32)[0]
    assert t1.bytes_sent == 3 * (ledger.alltoall(framed.slot_size(numel, torch.float32)[0], n)
                                 + ledger.alltoall(second, n))


def test_the_owners_error_feedback_makes_the_mean_of_rounds_converge():
    """The same vectors every round: what both compressions drop comes back, so the average of K rounds'
    means approaches the exact mean as 1/K (the error feedback identity), not the bias of one round."""
    n, g = 4, torch.Generator().manual_seed(1)
    x = {r: torch.randn(500, generator=g) for r in range(n)}
    exact = sum(x.values()) / n
    averager = scatter_mean(n)
    transport = SimTransport(n, RingNetwork(mbps=100, latency_ms=1), SimClock())
    means = torch.stack([averager.mean(transport, x) for _ in range(400)])

    def error(k: int) -> float:
        return float((means[:k].mean(0) - exact).norm() / exact.norm())

    # both residuals stay bounded, so the error of the K-round average falls as 1/K (8x from 50 to 400; 3x asked)
    assert error(1) > 0.5 and error(400) < 0.4 * error(50) and error(50) < 0.2 * error(1)


@pytest.mark.parametrize("network", [RingNetwork(mbps=10, latency_ms=1), PSNetwork(mbps=10, latency_ms=1),
                                     HalvingDoublingNetwork(mbps=10, latency_ms=1)])
def test_bytes_and_time_are_two_alltoalls_of_one_slot(network):
    """Per round: two all-to-alls of the largest chunk's message (1003 elements over 4: 251 → 32 bytes of
    signs and a float32 scale), counted by the ledger and timed by the network model, one after the other."""
    n = 4
    averager = scatter_mean(n)
    assert averager.slot_size(1003, torch.float32) == (36, False)
    transport = SimTransport(n, network, SimClock())
    handle = averager.start_payloads(transport, averager.payloads({r: torch.randn(1003) for r in range(n)}),
                                     torch.zeros(1003))
    assert transport.clock.now == 0.0  # priced, not paid, until the wait
    handle.wait()
    one = network.alltoall(36, n)
    assert transport.bytes_sent == 2 * one.bytes
    assert one.bytes == (ledger.star_alltoall(36, n) if isinstance(network, PSNetwork) else n * (n - 1) * 36)
    assert transport.clock.now == pytest.approx(2 * one.time_s, rel=1e-12)
    expected = (2 * 1e-3 + n * (n - 1) * 36 / 1.25e6 if isinstance(network, PSNetwork)
                else 1e-3 + (n - 1) * 36 / 1.25e6)
    assert one.time_s == pytest.approx(expected, rel=1e-12)


def test_the_scatter_route_sends_fewer_bytes_than_the_gather_route_at_16_workers():
    """Each link: 2·(n-1)/n messages a round instead of n - 1 (1-bit messages of a 137K vector)."""
    n, numel = 16, 137_000
    x = {r: torch.randn(numel) for r in range(n)}
    counts = {}
    for route in ("gather", "scatter"):
        averager = scatter_mean(n) if route == "scatter" else CompressedMean(
            build("sign:scaled=true"), {r: torch.Generator().manual_seed(r) for r in range(n)}, error_feedback=True)
        transport = SimTransport(n, RingNetwork(mbps=10, latency_ms=1), SimClock())
        averager.mean(transport, x)
        counts[route] = transport.bytes_sent
    assert counts["gather"] == ledger.allgather([numel // 8 + 4] * n)
    assert counts["scatter"] == 2 * ledger.alltoall(-(-numel // n) // 8 + 1 + 4, n)
    assert 7.9 < counts["gather"] / counts["scatter"] < 8.0  # n/2, less the chunks' scales


def test_a_bounded_codec_travels_framed_and_a_stochastic_one_repeats_after_a_restart():
    """Top-k chunks (a bound, not a size) travel framed at the bound; a round started twice from the same
    payloads (``Transport.restart`` after a resume) gives the same mean and keeps the owners' residuals
    and random streams once, so the next round equals that of a run that never restarted."""
    n = 3
    x = [{r: torch.randn(300, generator=torch.Generator().manual_seed(10 * k + r)) for r in range(n)}
         for k in range(3)]
    for spec in ("topk:ratio=0.1", "qsgd:levels=4,bucket=32"):
        straight, restarted = scatter_mean(n, spec), scatter_mean(n, spec)
        assert straight.slot_size(300, torch.float32)[1] == (spec.startswith("topk"))
        t1 = SimTransport(n, RingNetwork(), SimClock())
        t2 = SimTransport(n, RingNetwork(), SimClock())
        expected = [straight.mean(t1, xk) for xk in x]
        like = torch.zeros(300)
        got = [restarted.mean(t2, x[0])]
        payloads = restarted.payloads(x[1])
        restarted.start_payloads(t2, payloads, like)  # started, never waited: a checkpoint in flight
        again = t2.restart(lambda m=restarted, t=t2, p=payloads, z=like: m.start_payloads(t, p, z), None)
        got.append(again.wait())
        got.append(restarted.mean(t2, x[2]))
        for a, b in zip(expected, got, strict=True):
            assert torch.equal(a, b), spec
        assert t2.bytes_sent == t1.bytes_sent  # the restarted round counted once


@pytest.mark.parametrize("spec, extra", [
    ("muloco:inner_steps=3", {}),
    ("muloco:inner_steps=4,overlap=2,merge=carry", {}),  # a round in flight at the checkpoint
    ("streaming-diloco:inner_steps=4,fragments=2,overlap=2", dict(compressor="qsgd:levels=8,bucket=64",
                                                                  error_feedback=True)),
    # the owners' own stochastic codec, a round in flight at the checkpoint
    ("muloco:inner_steps=4,overlap=2,merge=carry", dict(owner_compressor="pquant:p=inf,block=32")),
])
def test_resume_mid_run_equals_never_stopping(make_config, spec, extra):
    extra |= dict(compressed_mean="scatter", network="ring:mbps=10,latency_ms=1")
    if spec.startswith("muloco"):
        extra |= dict(task="digits-mlp", lr=0.003)
    in_flight = resume_mid_run(make_config, spec, extra)
    assert in_flight == ("overlap" in spec)


@pytest.mark.parametrize("spec, extra", [("muloco:inner_steps=3", dict(task="digits-mlp")),
                                         ("muloco:inner_steps=3", dict(task="digits-mlp", owner_compressor="qsgd")),
                                         ("sync", dict(compressor="sign:scaled=true", error_feedback=True))])
def test_one_thread_per_rank_matches_the_simulator(make_config, spec, extra):
    cfg = make_config(algorithm=spec, lr=0.01, workers=3, compressed_mean="scatter", **extra)
    sim = Run(cfg)
    sim_infos = [sim.train_step() for _ in range(6)]
    threads = run_one_worker_per_thread(cfg, 6)
    for rank, got in threads.items():
        assert torch.equal(got["eval"], sim.algorithm.eval_params()), rank
        assert [i.get("merged") for i in got["infos"]] == [i.get("merged") for i in sim_infos], rank


def test_the_run_learns_and_its_bytes_are_the_ledger_s(make_config):
    cfg = make_config(algorithm="muloco:inner_steps=3", task="digits-mlp", lr=0.003, steps=12,
                      compressed_mean="scatter", network="ring:mbps=100,latency_ms=1")
    r = Run(cfg)
    before = r.evaluate()["train_loss"]
    for _ in range(12):
        r.train_step()
    assert r.evaluate()["train_loss"] < before
    numel = r.algorithm.theta.numel()
    slot, _ = r.algorithm.averager.slot_size(numel, torch.float32)
    assert r.transport.bytes_sent == 4 * 2 * ledger.alltoall(slot, 4)  # 4 rounds of H = 3


@pytest.mark.parametrize("overrides, words", [
    (dict(compressed_mean="bogus"), "valid choices are gather, scatter"),
    (dict(algorithm="diana"), "applies to"),
    (dict(algorithm="sync:backups=1", compressor="sign:scaled=true"), "sync without backups"),
    (dict(compressor="fp16"), "summed by an allreduce"),
    (dict(compressor="powersgd:rank=2"), "averages by allreduce itself"),
    (dict(compressor="threshold:tau=0.1"), "known size or bound"),
    (dict(compressor="sign", fault_tolerance="torchft:min_replicas=1", backend="torch"), "--fault-tolerance"),
    (dict(compressor="sign", compressed_mean="gather", owner_compressor="fp16"), "only --compressed-mean scatter"),
    (dict(compressor="sign", owner_compressor="threshold:tau=0.1"), "--owner-compressor threshold"),
    (dict(compressor="sign", owner_compressor="powersgd:rank=2"), "not an averager's"),
    (dict(compressor="sign", owner_compressor="sgn"), "unknown compressor 'sgn'"),
])
def test_what_the_scatter_route_refuses_is_one_line_naming_it(make_config, overrides, words):
    cfg = make_config(**({"compressed_mean": "scatter", "algorithm": "sync"} | overrides))
    with pytest.raises(ConfigError) as e:
        check_combination(cfg)
        Run(cfg)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_ablation_s_exact_owner_is_the_all_gather_of_chunked_messages(tmp_path, data_dir):
    """benchmarks/scatter_mean_ablation.py: the scatter route with the owners' mean sent exactly
    (``--owner-compressor none``) and the all-gather of messages cut in n chunks compute the same mean in
    the same order, so their runs end equal, bit for bit; the route as shipped (the owners' second
    compression) ends elsewhere, and each owners' codec carries its own bytes."""
    from tests.helpers import load_script

    ablation = load_script(ROOT / "benchmarks" / "scatter_mean_ablation.py", "scatter_mean_ablation")
    kw = dict(task="digits-mlp", algorithm="muloco:inner_steps=3", workers=4, steps=6, seed=3,
              data_dir=str(data_dir))
    runs = {v: ablation.run(v, out=str(tmp_path / v), **kw)
            for v in ("exact-owner", "chunked-gather", "scatter", "owner=qsgd:levels=7,bucket=32")}
    theta = {v: r.algorithm.theta for v, r in runs.items()}
    assert torch.equal(theta["exact-owner"], theta["chunked-gather"])
    assert not torch.equal(theta["exact-owner"], theta["scatter"])
    assert not torch.equal(theta["owner=qsgd:levels=7,bucket=32"], theta["scatter"])
    numel = runs["scatter"].algorithm.theta.numel()
    for v, owner in (("scatter", "sign:scaled=true"), ("exact-owner", "none"), ("owner=qsgd:levels=7,bucket=32",
                                                                                 "qsgd:levels=7,bucket=32")):
        averager = runs[v].algorithm.averager
        assert averager.owned.inner.spec() == build(owner).spec(), v
        first, second = averager.slot_size(numel, torch.float32)[0], averager.owned.slot_size(numel, torch.float32)[0]
        assert runs[v].transport.bytes_sent == 2 * (ledger.alltoall(first, 4) + ledger.alltoall(second, 4)), v


def test_the_ablation_command_prints_a_row_a_run_and_refuses_an_unknown_variant(tmp_path, data_dir, capsys):
    from tests.helpers import load_script

    ablation = load_script(ROOT / "benchmarks" / "scatter_mean_ablation.py", "scatter_mean_ablation")
    common = ["--task", "digits-mlp", "--workers", "4", "--steps", "3", "--seeds", "3,4", "--data-dir", str(data_dir),
              "--out", str(tmp_path / "run")]
    assert ablation.main([*common, "--variants", "gather,owner=pquant:p=inf,block=32"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[:2] for r in rows] == [["| gather", "3"], ["| gather", "4"],
                                                  ["| owner=pquant:p=inf,block=32", "3"],
                                                  ["| owner=pquant:p=inf,block=32", "4"]]
    with pytest.raises(SystemExit) as e:
        ablation.main([*common, "--variants", "gather,bogus"])
    assert e.value.code == 2 and "--variants: bogus; valid: gather, scatter" in capsys.readouterr().err
