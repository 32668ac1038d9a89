"""``benchmarks/time_to_quality.py``'s pure logic on constructed curves: DDP's target and the plateau
test, one evaluation's scatter, the time model against gradwire's own network model, the seed
that tunes never reported, the shared lr schedule and its horizon, the early stop, and the table
(ratios, rows not run, targets not reached)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_quality.py"


@pytest.fixture(scope="module")
def ttq():
    return load_script(BENCH, "time_to_quality")


def measured(compute_s=0.01, backward_s=0.006, payload_bytes=4000.0, **more):
    """A compute.json entry as ``compute`` writes it: one session, DDP's 0.01 s measured beside it,
    one bucket, no decode of others' payloads, no exchange of sizes (unless ``more`` says)."""
    return {"compute_s": compute_s, "backward_s": backward_s, "payload_bytes": payload_bytes, "session": "s",
            "ddp_compute_s": 0.01, "decode_s": 0.0, "size_exchanges": 0.0, "bucket_shares": [1.0]} | more


def test_target_is_the_mean_of_ddps_last_five_evaluations_at_n(ttq):
    steps = list(range(100, 2100, 100))
    losses = [3.0 - 0.05 * i for i in range(20)]
    # N = 1000: steps 600..1000 (indices 5..9)
    assert ttq.target_quality(steps, losses, 1000) == pytest.approx(sum(losses[5:10]) / 5)
    # the last quarter (the last evaluation at or before 750, then 1000): each end a five-evaluation mean
    before, after = sum(losses[2:7]) / 5, sum(losses[5:10]) / 5
    assert ttq.quarter_gain(steps, losses, 1000) == pytest.approx((before - after) / before)
    assert ttq.steps_to_target(steps, losses, losses[7] + 1e-12) == pytest.approx(800)
    # between two evaluations: where the line between them crosses the target (a quarter of the way)
    assert ttq.steps_to_target(steps, losses, losses[6] - 0.0125) == pytest.approx(725)
    assert ttq.steps_to_target(steps, losses, 5.0) == 100  # the first evaluation already under it
    assert ttq.steps_to_target([100, 200], [float("inf"), 1.0], 2.0) == 200  # no line from a diverged point
    assert ttq.steps_to_target(steps, losses, 0.1) is None


def test_evaluation_noise_recovers_the_scatter_about_a_trend(ttq):
    import random

    rng = random.Random(0)
    losses = [2.0 - 1e-5 * i + rng.gauss(0, 0.01) for i in range(4000)]  # 0.5 % of ~1.98
    assert ttq.evaluation_noise(losses) == pytest.approx(0.01 / 1.98, rel=0.05)
    assert ttq.evaluation_noise([2.0 - 0.01 * i for i in range(50)]) < 1e-6  # a straight trend: no scatter


def test_the_time_model_is_gradwires_ring_network(ttq):
    from gradwire.transports import ledger
    from gradwire.transports.network import NETWORKS

    for workers, mbps, nbytes in [(4, 100.0, 5_783_296), (16, 10.0, 548_864), (64, 1000.0, 1000)]:
        # the ring model's closed forms (Patarasuk & Yuan 2009), k collectives sharing B bytes a worker:
        # allreduce 2(n-1)(k·latency + B/(n·bw)); allgather (n-1)(k·latency + B/bw)
        bw, lat = mbps * 1e6 / 8, 1e-3
        for k in (1, 3):
            assert ttq.allreduce_seconds(nbytes, workers, mbps, collectives=k) == pytest.approx(
                2 * (workers - 1) * (k * lat + nbytes / (workers * bw)))
            assert ttq.collective_seconds("allgather", nbytes, workers, mbps, collectives=k) == pytest.approx(
                (workers - 1) * (k * lat + nbytes / bw))
        # one worker's B from the ledger's count of the collective
        assert ledger.allreduce(nbytes, workers) / ttq.ledger_divisor("allreduce", workers) == nbytes
        assert ledger.allgather([nbytes] * workers) / ttq.ledger_divisor("allgather", workers) == nbytes
        # the scatter route: two all-to-alls of B/n a worker, every message posted at once (gloo's alltoall),
        # B the whole message that the ledger's two all-to-alls of n slots count
        assert ttq.collective_seconds("scatter", nbytes, workers, mbps) == pytest.approx(
            2 * (lat + (workers - 1) * nbytes / workers / bw))
        slot = nbytes // workers
        assert 2 * ledger.alltoall(slot, workers) / ttq.ledger_divisor("scatter", workers) == slot * workers
    with pytest.raises(ValueError, match="allreduce, allgather or scatter"):
        ttq.collective_seconds("broadcast", 1, 4, 10.0)
    scatter = ttq.ROW["muloco-sign-h3-tau1-carry-mu0.9-scatter"]  # τ = 1: hidden behind one step's compute
    assert scatter.run["compressed_mean"] == "scatter" and scatter.collective == "scatter"
    comm = ttq.collective_seconds("scatter", 17_129, 16, 10.0)
    # its round's averaging measured at each worker count: the one-worker measurement holds the
    # one-worker round (2 ms), and 16 workers' round (4 ms) costs 2 ms more a round
    rounds = {"1": 0.002, "4": 0.0025, "16": 0.004, "64": 0.009}
    cost = measured(0.024, 0.01, 17_129, scatter_round_s=rounds)
    compute = 0.024 + (0.004 - 0.002) / 3
    assert ttq.step_seconds(scatter, cost, 16, 10.0) == pytest.approx(compute + max(0.0, comm - compute) / 3)
    assert ttq.step_seconds(scatter, cost, 16, None) == pytest.approx(compute)
    with pytest.raises(SystemExit, match="no scatter round cost at 16 workers"):
        ttq.step_seconds(scatter, measured(0.024, 0.01, 17_129), 16, 10.0)
    qsgd = ttq.ROW["gw-qsgd"]  # an allgather, not hidden: (n-1)(latency + B/bw) a step
    gather = NETWORKS.build("ring:mbps=10,latency_ms=1").allgather([20_000] * 16).time_s
    assert ttq.step_seconds(qsgd, measured(0.01, 0.006, 20_000), 16, 10.0) == pytest.approx(0.01 + gather)
    row = ttq.ROW["ddp"]
    # a zero-cost network leaves the compute alone; one bucket (a gradient under 1 MiB) starts after the
    # backward pass, so nothing of it is hidden
    assert ttq.step_seconds(row, measured(0.1, 0.06, 0), 4, None) == 0.1
    comm = ttq.allreduce_seconds(5e6, 4, 100.0)
    assert ttq.step_seconds(row, measured(0.1, 0.06, 5e6), 4, 100.0) == pytest.approx(0.1 + comm)
    diloco = ttq.ROW["diloco"]  # once per H steps, not hidden
    assert ttq.step_seconds(diloco, measured(0.1, 0.06, 5e6), 4, 100.0) == pytest.approx(0.1 + comm / diloco.period)
    streaming = ttq.ROW["streaming"]  # a fragment hidden behind τ = 2 steps
    assert ttq.step_seconds(streaming, measured(0.1, 0.06, 1e5), 4, 100.0) == 0.1
    # priced as halving-doubling: 16 workers' allreduce takes 2·log2(16) = 8 latencies, not 30, for the
    # same bytes; an allgather 4, not 15
    bw = 100e6 / 8
    assert ttq.collective_seconds("allreduce", 1.6e5, 16, 100.0, network="halving-doubling") == pytest.approx(
        8e-3 + 2 * 15 / 16 * 1.6e5 / bw)
    assert ttq.collective_seconds("allgather", 1e4, 16, 100.0, network="halving-doubling") == pytest.approx(
        4e-3 + 15 * 1e4 / bw)
    assert ttq.step_seconds(diloco, measured(0.1, 0.06, 5e6), 16, 100.0, "halving-doubling") == pytest.approx(
        0.1 + (8e-3 + 2 * 15 / 16 * 5e6 / bw) / diloco.period)


def test_tuning_seed_is_never_a_table_seed_and_the_best_finite_trial_wins(ttq):
    ttq.check_seeds(ttq.TUNING_SEED, ttq.TABLE_SEEDS)
    with pytest.raises(ValueError, match="tuning seed 0 is also a table seed"):
        ttq.check_seeds(0, [0, 1, 2])
    assert ttq.best_trial({1e-3: 2.0, 2e-3: 1.9, 4e-3: float("nan")}) == 2e-3
    with pytest.raises(ValueError, match="every trial diverged"):
        ttq.best_trial({1e-3: float("nan")})


def test_every_row_walks_the_same_grid_until_its_best_trial_is_a_minimum(ttq):
    nan = float("nan")
    grid, first = (1e-3, 2e-3, 4e-3, 8e-3), (2e-3, 4e-3)
    walk = lambda trials: ttq.next_trial(trials, grid, first)  # noqa: E731
    assert walk({}) == 2e-3 and walk({2e-3: 2.0}) == 4e-3
    assert walk({2e-3: 2.0, 4e-3: 1.9}) == 8e-3  # improving upwards: on up
    assert walk({2e-3: 2.0, 4e-3: 1.9, 8e-3: 1.95}) is None  # 4e-3 is a minimum
    assert walk({2e-3: 2.0, 4e-3: 1.9, 8e-3: 1.8}) is None  # the grid's end
    assert walk({2e-3: 1.9, 4e-3: 2.0}) == 1e-3  # worse upwards: down
    assert walk({2e-3: 1.9, 4e-3: nan}) == 1e-3  # a diverged trial counts as worst
    assert walk({2e-3: 1.9, 4e-3: 2.0, 1e-3: 2.1}) is None


def test_every_row_shares_one_schedule_whose_horizon_is_n_samples_and_whose_floor_holds_after(ttq):
    from gradwire.algorithms.optim import ScheduledRate

    n = 1000
    spec, horizon = ttq.schedule(ttq.ROW["ddp"], n)
    assert horizon == n and spec == f"cosine:warmup={ttq.WARMUP},min_ratio={ttq.MIN_RATIO:g}"
    assert ttq.schedule(ttq.ROW["diloco"], n) == (spec, n)  # the inner AdamW's, update by update
    rate = ScheduledRate(4e-3, spec, horizon)
    assert rate.at(ttq.WARMUP - 1) == pytest.approx(4e-3)  # warm-up done: the peak
    assert rate.at(n - 1) == pytest.approx(4e-3 * ttq.MIN_RATIO, rel=1e-4)  # decayed by N
    assert rate.at(n) == rate.at(2 * n - 1) == pytest.approx(4e-3 * ttq.MIN_RATIO)  # the floor to 2N
    # accumulation over k: N/k updates of k micro-batches, the same samples as DDP's N steps
    spec8, horizon8 = ttq.schedule(ttq.ROW["ddp-accum8"], n)
    assert horizon8 == n // 8 and f"warmup={ttq.WARMUP // 8}," in spec8
    base = lambda step, every, h: step % every == 0 or step == h  # noqa: E731 - the base algorithm's rule
    ddp_grid = [s for s in range(1, 2 * n + 1) if ttq.evaluates_here(ttq.ROW["ddp"], s, n, base)]
    accum_grid = [s for s in range(1, 2 * horizon8 + 1) if ttq.evaluates_here(ttq.ROW["ddp-accum8"], s, horizon8, base)]
    assert ddp_grid[-1] == 2 * n and n in ddp_grid and horizon8 in accum_grid
    # from N/2 on both evaluate every EVAL_EVERY samples' worth (k = 8: to within one update)
    start = n // 2 + 3 * ttq.EVAL_EVERY // 2
    late, ddp_late = [s * 8 for s in accum_grid if s * 8 > start], [s for s in ddp_grid if s > start]
    assert len(late) == len(ddp_late) and all(abs(a - b) < 8 for a, b in zip(late, ddp_late))


def test_a_curve_stops_a_few_evaluations_after_it_first_reaches_the_target(ttq):
    losses = [3.0, 2.5, 2.1, 2.04, 2.06, 2.03, 2.02]
    assert not ttq.reached(losses, None)  # DDP: no target while its own curves run
    assert not ttq.reached(losses[:5], 2.05, after=3)  # first at index 3, one evaluation after
    assert ttq.reached(losses[:7], 2.05, after=3)
    assert not ttq.reached(losses, 1.0)  # never reached: runs to 2N
    # first under it at 400 (2.04), the line from 300 (2.1) crosses 2.05 at 300 + 100·0.05/0.06
    assert ttq.steps_to_target([100, 200, 300, 400, 500, 600, 700], losses, 2.05) == pytest.approx(300 + 250 / 3)


def test_table_gives_ratios_to_ddp_at_zero_cost_and_marks_what_did_not_run(ttq):
    steps = [100, 200, 300, 400]
    curve = dict(steps=steps, params=1000, bytes=[1, 2, 3, 4])
    results = {"ddp": [curve | dict(losses=[3.0, 2.5, 2.1, 2.0])],
               "diloco": [curve | dict(losses=[2.8, 2.4, 2.0, 1.9])],
               "local-adamw": [curve | dict(losses=[3.0, 2.9, 2.8, 2.7])]}
    compute = {k: measured() for k in results}
    compute["diloco"]["payload_bytes"] = 4000.0 * 20  # the whole model, once a round
    lines = {line["key"]: line for line in ttq.table_rows(2.05, results, compute, 4)}
    assert lines["torch-powersgd"]["status"] == "not run" and lines["ddp-bf16"]["status"] == "not run"
    # interpolated: DDP crosses 2.05 halfway from 300 to 400, DiLoCo 7/8 of the way from 200 to 300
    assert lines["ddp"]["steps"][0] == pytest.approx(350) and lines["diloco"]["steps"][0] == pytest.approx(287.5)
    assert lines["ddp"]["t@None"][0] == pytest.approx(3.5)
    slow = ttq.allreduce_seconds(80_000, 4, 10.0) / 20  # DiLoCo: one round of 80 kB per 20 steps
    assert lines["diloco"]["x@10.0"] == pytest.approx(287.5 * (0.01 + slow) / 3.5)
    assert lines["diloco"]["bits_per_param_step"] == pytest.approx(8 * 80_000 / 1000 / 20)
    assert lines["local-adamw"]["steps"][0] is None and lines["local-adamw"]["best"] == 2.7
    text = ttq.markdown(list(lines.values()), 4, 2.05)
    assert "not reached in 1 seeds (best 2.7000)" in text and "| PyTorch PowerSGD hook r4 | not run |" in text
    ddp_at_10 = lines["ddp"]["t@10.0"][0]
    assert lines["diloco"]["vs_ddp@10.0"] == pytest.approx(ddp_at_10 / lines["diloco"]["t@10.0"][0])


def test_the_targets_table_judges_every_gradwire_row_and_names_the_best(ttq):
    """Every row is DDP, PyTorch's or gradwire's, none left out of the targets' table (it once missed
    the MuLoCo rows added after its list was written, and said "none reached" beside a row that had)."""
    report = load_script(BENCH.with_name("time_to_quality_report.py"), "time_to_quality_report")
    keys = [r.key for r in ttq.ROWS]
    assert sorted(["ddp", *report.TORCH_ROWS, *report.GRADWIRE_ROWS]) == sorted(keys)
    steps = [100, 200, 300, 400]
    curve = dict(steps=steps, params=1000, bytes=[1, 2, 3, 4])
    late = "muloco-k512-h3-ns3-tau1-eta0.5"  # a row added late to ROWS
    results = {"ddp": [curve | dict(losses=[3.0, 2.5, 2.1, 2.0])],
               "ddp-bf16": [curve | dict(losses=[3.0, 2.5, 2.1, 2.0])],
               late: [curve | dict(losses=[2.9, 2.4, 2.0, 1.9])]}
    compute = {k: measured() for k in results}
    compute["ddp-bf16"]["payload_bytes"] = 2000.0  # half DDP's bytes: PyTorch's best
    text = report.targets(ttq.table_rows(2.05, results, compute, 16), 16)
    label = ttq.ROW[late].label
    assert text.count(f"| {label} |") == 3 and "none reached" not in text  # the best row at every rate
    assert "| DDP + bf16 cast |" in text


def test_pytorchs_run_follows_the_same_schedule_and_stays_at_its_floor_past_the_horizon():
    """ddp_train.py --lr-horizon (PyTorch's PowerSGD hook row): torch's LambdaLR gives update k
    the rate gradwire's ScheduledRate gives it, past the horizon too."""
    import torch

    from gradwire.algorithms.optim import ScheduledRate

    ddp_train = load_script(BENCH.parent / "ddp_train.py", "ddp_train")
    spec = "cosine:warmup=5,min_ratio=0.1"
    args = ddp_train.parse(["--optimizer", "adamw", "--lr", "0.004", "--lr-schedule", spec, "--steps", "40",
                            "--lr-horizon", "20"])
    opt, schedule = ddp_train.make_optimizer(args, [torch.nn.Parameter(torch.zeros(3))])
    rate = ScheduledRate(0.004, spec, 20)
    for k in range(40):
        assert opt.param_groups[0]["lr"] == pytest.approx(rate.at(k))
        opt.step()
        schedule.step()
    assert rate.at(39) == pytest.approx(0.0004)


def test_every_row_is_a_valid_spec_and_its_overlap_matches_its_algorithm(ttq):
    """Each row's algorithm spec builds (a renamed parameter would otherwise surface only after
    minutes of training), and a row modelled as hiding τ steps behind compute does overlap by τ."""
    from gradwire.algorithms.base import ALGORITHMS
    from gradwire.spec import parse_spec

    for row in ttq.ROWS:
        alg = ALGORITHMS.build(row.algorithm)
        if row.overlap.startswith("tau:"):
            assert alg.overlap == int(row.overlap.split(":")[1]), row.key
            assert row.period == alg.inner_steps // alg.fragments, row.key
        name, params = parse_spec(row.algorithm)
        if "anneal" in row.key:
            assert params.get("outer_schedule") == "inner", row.key


def test_the_bit_rate_table_keeps_rows_at_or_under_the_rate_and_says_which_reached(ttq):
    """Bits per parameter per round from the payload (8·B/params), per step that over the period;
    the ≤ 0.25-bit table lists the rows at or under it, reached or not, and none above."""
    steps = [100, 200, 300, 400]
    curve = dict(steps=steps, params=1000, bytes=[1, 2, 3, 4])
    results = {"ddp": [curve | dict(losses=[3.0, 2.5, 2.1, 2.0])],
               "muloco-k96-h3": [curve | dict(losses=[2.8, 2.4, 2.0, 1.9]), curve | dict(losses=[2.9, 2.6, 2.2, 2.1])],
               "sparseloco-k96-h3": [curve | dict(losses=[3.0, 2.9, 2.8, 2.7])],
               "muloco-h3": [curve | dict(losses=[2.8, 2.4, 2.0, 1.9])]}
    compute = {k: measured(0.01, 0.006, 4000.0) for k in results}
    compute["muloco-k96-h3"]["payload_bytes"] = 30.0    # 0.24 bits a parameter a round
    compute["sparseloco-k96-h3"]["payload_bytes"] = 31.25  # 0.25: at the rate, counted
    compute["muloco-h3"]["payload_bytes"] = 32.0        # 0.256: above it
    lines = ttq.table_rows(2.05, results, compute, 4)
    by = {line["key"]: line for line in lines}
    assert by["muloco-k96-h3"]["bits_per_param_round"] == pytest.approx(0.24)
    assert by["muloco-k96-h3"]["bits_per_param_step"] == pytest.approx(0.08)  # H = 3
    text = ttq.quality_at_rate(lines)
    assert "| MuLoCo H=3 top-k 96/4096 + EF | 0.240 | yes, 1 of 2 seeds | 288 |" in text  # 287.5, interpolated
    assert "| SparseLoCo H=3 top-k 96/4096 α=1 | 0.250 | no (best 2.7000) | — |" in text
    assert "2-bit" not in text and "DDP (AdamW)" not in text
    assert "none ran" in ttq.quality_at_rate(lines, max_bits=0.1)


def test_the_low_communication_rows_gather_their_messages_and_tie_muon_to_the_walked_rate(ttq):
    """MuLoCo, SparseLoCo and DeMo send messages that cannot be summed on the way: allgather; the
    MuLoCo rows scale Muon's η with the trial's lr (one walked rate for both of its optimizers)."""
    for key in ("muloco-k96-h3", "muloco-h3", "muloco-k96-h10", "sparseloco-k96-h3", "demo-k1of64"):
        assert ttq.ROW[key].collective == "allgather" and ttq.ROW[key].overlap == "none"
    assert ttq.ROW["muloco-k96-h10"].period == 10 and ttq.ROW["demo-k1of64"].period == 1
    assert f"muon_lr_ratio={ttq.MUON_LR_RATIO}" in ttq.ROW["muloco-h3"].algorithm
    assert ttq.ROW["muloco-k96-h3"].run == {"compressor": ttq.MESSAGE_K96}
    assert ttq.ROW["muloco-h3"].run == {"compressor": "pquant:p=inf,block=64"}
    # a cast is summed on the way: MuLoCo's averager (error feedback on) takes an allreduce for it
    from gradwire.averaging import CompressedMean
    from gradwire.compress import build

    assert CompressedMean(build("fp16"), {}, error_feedback=True).allreduced()
    assert not CompressedMean(build(ttq.MESSAGE_K96), {}, error_feedback=True).allreduced()
    for key in ("muloco-fp16-h1-ns3", "muloco-fp16-h3-ns3", "muloco-fp16-h6-ns3-eager-eta1"):
        assert ttq.ROW[key].collective == "allreduce" and ttq.ROW[key].run == {"compressor": "fp16"}
    assert ttq.ROW["muloco-fp16-h6-ns3-eager-eta1"].overlap == "tau:6"


def test_tune_with_lrs_screens_those_rates_only_and_never_chooses_one(ttq, tmp_path):
    """``tune --lrs``, end to end on a tiny run (N = 60 steps, 2 workers): the given rates are trained
    on the tuning seed and recorded in screening/<row>.json, outside the walk: no tuning/<row>.json,
    so no chosen rate."""
    out = tmp_path / "ttq"
    assert ttq.main(["tune", "--rows", "ddp", "--lrs", "0.002,0.004", "--n-steps", "60", "--workers", "2",
                     "--out", str(out)]) == 0
    import json

    screened = json.loads((out / "screening" / "ddp.json").read_text())
    assert screened["row"] == "ddp" and set(screened["trials"]) == {"0.002", "0.004"}
    assert all(2.0 < q < 6.0 for q in screened["trials"].values())  # a byte-level loss after 60 steps: finite
    assert screened["trials"]["0.002"] != screened["trials"]["0.004"]
    assert not (out / "tuning").exists() and not (out / "tuning.json").exists()
    curve = json.loads((out / "w2" / "ddp" / "lr0.002-seed0" / "curve.json").read_text())
    assert curve["seed"] == ttq.TUNING_SEED and curve["steps"][-1] == 60
    # the same screening with --pick (end to end through main): the better rate becomes the row's
    assert ttq.main(["tune", "--rows", "ddp", "--lrs", "0.002,0.004", "--pick", "--n-steps", "60", "--workers", "2",
                     "--out", str(out)]) == 0
    best = min(screened["trials"], key=screened["trials"].get)
    assert ttq.load_tuning(out)["ddp"] == float(best) and "not walked" in ttq.load_tuning(out)["ddp:note"]


def test_screens_of_one_row_run_at_once_keep_each_others_trials(ttq, tmp_path, monkeypatch):
    """Two screens of one row at once, one rate each (the 64-worker pass ran them as two processes):
    the first finishes its trial after the second has written its own, and the file keeps both (it
    kept only the last writer's, which read the file before the other's trial was there)."""
    import json
    import threading

    first_training, second_wrote, losses = threading.Event(), threading.Event(), {0.004: 1.44, 0.008: 1.43}

    def train(row, lr, *args, **kwargs):
        if lr == 0.004:  # the first screen's trial ends only once the second screen has written
            first_training.set()
            assert second_wrote.wait(30)
        return {"status": "finished", "steps": [1000], "losses": [losses[lr]]}

    monkeypatch.setattr(ttq, "train", train)
    monkeypatch.setattr(ttq, "target_quality", lambda steps, losses_, horizon: losses_[-1])
    row = ttq.ROW["ddp"]
    first = threading.Thread(target=ttq.screen, args=(row, [0.004], 1000, 64, tmp_path))
    first.start()
    assert first_training.wait(30)  # the second screen starts while the first one trains
    ttq.screen(row, [0.008], 1000, 64, tmp_path)
    second_wrote.set()
    first.join(30)
    assert json.loads((tmp_path / "screening" / "ddp.json").read_text())["trials"] == {"0.008": 1.43, "0.004": 1.44}
    assert ttq.pick_screened(row, 64, tmp_path)["ddp"] == 0.008


def test_pick_makes_the_best_screened_rate_the_chosen_one_and_says_it_was_not_walked(ttq, tmp_path):
    """``tune --lrs A,B --pick`` (the reduced protocol the 64-worker pass used): the best finite screened
    trial becomes the row's rate in tuning/<row>.json, with every trial and a note; a diverged trial never
    wins; ``--pick`` without a screening is refused before anything runs."""
    import json

    (tmp_path / "screening").mkdir()
    trials = {"0.004": 1.49, "0.008": 1.51, "0.016": float("nan")}
    (tmp_path / "screening" / "ddp.json").write_text(json.dumps({"row": "ddp", "trials": trials}))
    picked = ttq.pick_screened(ttq.ROW["ddp"], 64, tmp_path)
    assert picked["ddp"] == 0.004 and set(picked["ddp:trials"]) == set(trials)
    assert picked["ddp:trials"]["0.016"]["status"] == "diverged" and "64 workers" in picked["ddp:note"]
    assert "not walked" in picked["ddp:note"]
    assert ttq.load_tuning(tmp_path)["ddp"] == 0.004  # the other stages take it
    trials |= {"0.002": 1.40}
    (tmp_path / "screening" / "ddp.json").write_text(json.dumps({"row": "ddp", "trials": trials}))
    assert ttq.pick_screened(ttq.ROW["ddp"], 64, tmp_path)["ddp"] == 0.002
    for argv in (["tune", "--pick"], ["curves", "--lrs", "0.002", "--pick"]):
        with pytest.raises(SystemExit, match="--pick chooses among screened rates"):
            ttq.main([*argv, "--rows", "ddp", "--out", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()


def test_another_task_is_for_the_compute_stage_only(ttq, tmp_path, monkeypatch):
    """``--task`` measures compute on another model; the stages whose curves make the table refuse it,
    and the compute stage measures on it (its runs built on that task)."""
    for stage in ("tune", "curves", "report"):
        with pytest.raises(SystemExit, match="--task stdlib-lm: only the compute stage measures another task"):
            ttq.main([stage, "--task", "stdlib-lm", "--rows", "ddp", "--out", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()
    seen = []
    monkeypatch.setattr(ttq, "measure_compute", lambda rows, lrs, n: seen.append(ttq.TASK) or {})
    monkeypatch.setattr(ttq, "TASK", ttq.TASK)  # restored after the test
    ttq.main(["compute", "--task", "digits-mlp", "--rows", "ddp", "--out", str(tmp_path / "other")])
    assert seen == ["digits-mlp"]


def test_a_row_screened_at_one_rate_takes_it_and_the_newton_schulz_rows_differ_only_there(ttq, tmp_path):
    """``screened_rates``: a row screened at exactly one rate (a variant tried at its parent's chosen
    rate) is reported and trained at it; one screened at several is not (only a walk chooses). The
    fewer-iteration MuLoCo rows are muloco-k96-h3 with ns_steps (and Polar Express's coefficients) only."""
    import json

    (tmp_path / "screening").mkdir()
    for key, trials in (("muloco-k96-h3-ns3", {"0.002": 1.67}), ("diloco-mu0.8", {"0.002": 1.8, "0.008": 1.9})):
        (tmp_path / "screening" / f"{key}.json").write_text(json.dumps({"row": key, "trials": trials}))
    assert ttq.screened_rates(tmp_path) == {"muloco-k96-h3-ns3": 0.002}
    base = ttq.ROW["muloco-k96-h3"].algorithm
    assert ttq.ROW["muloco-k96-h3-ns3"].algorithm == base.replace("outer_momentum=0,", "outer_momentum=0,ns_steps=3,")
    assert ttq.ROW["muloco-k96-h3-pe3"].algorithm == base.replace(
        "outer_momentum=0,", "outer_momentum=0,ns_steps=3,ns_coefficients=polar-express,")
    assert ttq.ROW["muloco-k96-h3-ns3"].run == ttq.ROW["muloco-k96-h3"].run


def test_the_report_stage_writes_each_pricing_beside_the_other(ttq, tmp_path):
    """``report`` on constructed curves: ring pricing in results.md, ``--collectives
    halving-doubling`` in results-halving-doubling.md (same steps, shorter times at 16 workers),
    plots for each, and the targets table naming the row that reached."""
    import json

    n = 400
    steps = list(range(0, 2 * n + 1, 100))
    curves = {"ddp": [3.0, 2.6, 2.3, 2.1, 2.0, 1.99, 1.98, 1.97, 1.96],
              "diloco": [3.0, 2.8, 2.5, 2.2, 2.05, 2.0, 1.98, 1.95, 1.9]}
    lrs = {"ddp": 0.004, "diloco": 0.004}
    for key, losses in curves.items():
        folder = ttq.run_folder(tmp_path, ttq.ROW[key], lrs[key], 1, 16)
        folder.mkdir(parents=True)
        (folder / "curve.json").write_text(json.dumps(
            {"steps": steps, "losses": losses, "bytes": [1000 * s for s in steps], "params": 1000, "seed": 1}))
        (tmp_path / "tuning").mkdir(exist_ok=True)
        (tmp_path / "tuning" / f"{key}.json").write_text(json.dumps({key: lrs[key]}))
    (tmp_path / "compute.json").write_text(json.dumps(
        {k: measured(0.01, 0.005, 4000.0 * (20 if k == "diloco" else 1)) for k in curves}))
    load_script(BENCH.with_name("time_to_quality_report.py"), "time_to_quality_report")  # as main imports it
    assert ttq.main(["report", "--workers", "16", "--seeds", "1", "--n-steps", str(n), "--out", str(tmp_path)]) == 0
    assert ttq.main(["report", "--workers", "16", "--seeds", "1", "--n-steps", str(n), "--out", str(tmp_path),
                     "--collectives", "halving-doubling"]) == 0
    ring = json.loads((tmp_path / "results.json").read_text())
    hd = json.loads((tmp_path / "results-halving-doubling.json").read_text())
    assert (ring["network"], hd["network"]) == ("ring", "halving-doubling")
    row = {x["key"]: x for x in ring["workers"]["16"]["rows"]}["diloco"]
    row_hd = {x["key"]: x for x in hd["workers"]["16"]["rows"]}["diloco"]
    assert row["steps"] == row_hd["steps"] and row_hd["t@100.0"][0] < row["t@100.0"][0]
    assert "collectives priced as halving-doubling" in (tmp_path / "results-halving-doubling.md").read_text()
    assert f"| 100 Mbit/s | {ttq.ROW['diloco'].label} |" in (tmp_path / "results.md").read_text()
    # no DDP blocks in these entries: the report names the rows priced by their fastest block
    assert "priced by their fastest block instead (no DDP blocks of their session kept; `compute --rows` " \
           "measures them again): diloco (1.00x)." in (tmp_path / "results.md").read_text()
    for suffix in ("", "_halving-doubling"):
        assert (tmp_path / f"quality_vs_time_w16{suffix}.png").stat().st_size > 0


def test_ddps_buckets_hide_only_what_is_ready_before_the_backward_pass_ends(ttq):
    """Two equal buckets: the first (ready halfway through the backward pass) travels while the
    second half computes; the second starts when it is ready and the link is free; the step waits
    for it. Each bucket pays its own latencies."""
    row, b, payload = ttq.ROW["ddp"], 0.06, 5e6
    half = ttq.allreduce_seconds(payload / 2, 4, 100.0)
    end = max(b / 2 + half, b) + half
    cost = measured(0.1, b, payload, bucket_shares=[0.5, 0.5])
    assert ttq.step_seconds(row, cost, 4, 100.0) == pytest.approx(0.1 + end - b)
    # many small buckets early in a long backward pass: only the last bucket's collective shows
    cost = measured(0.1, 10.0, payload, bucket_shares=[0.25] * 4)
    assert ttq.step_seconds(row, cost, 4, 100.0) == pytest.approx(0.1 + ttq.allreduce_seconds(payload / 4, 4, 100.0))
    assert ttq.bucket_shares([(100, 100), (100,)], cap_bytes=4 * 10_100) == [1.0]  # under the cap: one bucket
    assert ttq.bucket_shares([(100, 100), (100,)], cap_bytes=4 * 10_000) == pytest.approx([100 / 10_100,
                                                                                          10_000 / 10_100])


def test_an_allgathered_round_is_decoded_by_every_worker_and_a_variable_size_waits_for_the_sizes(ttq):
    """Each worker decodes all n payloads of an all-gathered round (the 1-worker measurement, its own
    only); a message of no fixed size first exchanges the sizes, blocking, which τ steps cannot hide."""
    from gradwire.transports import ledger

    row = ttq.ROW["muloco-k512-h3-ns3-tau1-eta0.5"]  # τ = 1, H = 3, chunked top-k: no fixed size
    cost = measured(0.0129, 0.005, 14_114.0, decode_s=0.001, size_exchanges=1.0)
    compute = 0.0129 + 15 * 0.001 / 3
    assert ttq.step_seconds(row, cost, 16, None) == pytest.approx(compute)
    sizes = ttq.collective_seconds("allgather", ledger.SIZE_BYTES, 16, 100.0)
    comm = ttq.collective_seconds("allgather", 14_114.0, 16, 100.0)
    assert sizes == pytest.approx(15 * (1e-3 + 8 / 12.5e6))
    assert ttq.step_seconds(row, cost, 16, 100.0) == pytest.approx(compute + (sizes + max(0.0, comm - compute)) / 3)
    assert ttq.step_seconds(row, cost | {"size_exchanges": 0.0}, 16, 100.0) == pytest.approx(
        compute + max(0.0, comm - compute) / 3)


def test_a_row_is_priced_by_its_ratio_to_the_ddp_measured_beside_it(ttq):
    """A row measured in another ``compute`` session keeps its ratio to that session's DDP; an entry
    from before sessions were recorded is refused, naming the row."""
    compute = {"ddp": measured(0.010, 0.005), "diloco": measured(0.012, 0.004, ddp_compute_s=0.008, decode_s=0.002)}
    cost = ttq.row_cost(compute, "diloco")
    assert cost["compute_s"] == pytest.approx(0.015) and cost["decode_s"] == pytest.approx(0.0025)
    assert cost["backward_s"] == 0.005 and ttq.row_cost(compute, "ddp")["compute_s"] == 0.010
    compute["scatter"] = measured(0.012, 0.004, ddp_compute_s=0.008, scatter_round_s={"1": 0.002, "16": 0.004})
    assert ttq.row_cost(compute, "scatter")["scatter_round_s"] == pytest.approx({"1": 0.0025, "16": 0.005})
    compute["diloco"] = {"compute_s": 0.012, "backward_s": 0.004, "payload_bytes": 1.0}
    with pytest.raises(SystemExit, match="'diloco'.*session.*compute --rows diloco"):
        ttq.row_cost(compute, "diloco")


@pytest.mark.slow
def test_compute_measures_ddp_beside_the_rows_and_their_wire(ttq, tmp_path):
    """``compute --rows`` of a top-k MuLoCo row: DDP measured in the same session; the row's payload
    decoded at a cost, and framed at its codec's bound (so no exchange of sizes is priced: chunked
    top-k's size depends on the data, within the bound); DDP's 0.52 MiB gradient one bucket."""
    import json
    import statistics

    from gradwire.compress import build

    assert ttq.main(["compute", "--rows", "muloco-k96-h3", "--out", str(tmp_path)]) == 0
    compute = json.loads((tmp_path / "compute.json").read_text())
    ddp, row = compute["ddp"], compute["muloco-k96-h3"]
    assert ddp["session"] == row["session"] and row["ddp_compute_s"] == ddp["compute_s"]
    assert row["size_exchanges"] == 0.0 == ddp["size_exchanges"]
    assert row["payload_bytes"] == 4 + build(ttq.MESSAGE_K96).max_nbytes(137_216)
    assert row["decode_s"] > 0 and ddp["decode_s"] == 0.0
    assert ddp["bucket_shares"] == [1.0] and ddp["payload_bytes"] == 4 * 137_216
    # each row keeps DDP's blocks of its session, which its paired ratio divides its own by, turn by turn
    assert row["ddp_blocks_s"] == ddp["blocks_s"] and len(row["blocks_s"]) == len(ddp["blocks_s"])
    ddp["blocks_s"] = [2 * b for b in ddp["blocks_s"]]  # DDP measured again later: the row keeps its own
    assert ttq.paired_ratio(compute, "muloco-k96-h3") == statistics.median(
        a / b for a, b in zip(row["blocks_s"], row["ddp_blocks_s"]))


def test_a_row_is_priced_by_the_median_of_its_blocks_over_ddps_not_by_one_unusually_fast_block(ttq):
    """The eighteenth pass's first compute session, as measured: its τ = 2 row's fastest block (10.27 ms
    against nine of 12.9-14.7) would price it at 1.18x DDP's step; its blocks over DDP's beside them
    give 1.50x (the median), and that is its price, at the reference DDP's step. DDP's blocks are the
    row's own copy, or DDP's where DDP was measured in the row's session; a row of another session
    without its copy falls back to its fastest block over its session's DDP's, and is listed."""
    ddp = [8.67, 8.95, 9.28, 9.22, 9.06, 9.18, 9.17, 9.28, 9.18, 9.38]
    rows = {"tau1": [13.55, 13.75, 14.08, 13.83, 13.5, 13.33, 14.34, 13.68, 14.27, 13.07],
            "tau2": [13.49, 13.18, 14.65, 14.29, 12.92, 13.45, 14.28, 13.57, 13.94, 10.27]}
    compute = {"ddp": measured(min(ddp), 0.005) | {"blocks_s": ddp, "session": "s1"}}
    for key, blocks in rows.items():
        compute[key] = measured(min(blocks), 0.004, ddp_compute_s=min(ddp)) | {
            "blocks_s": blocks, "session": "s1", "ddp_blocks_s": ddp}
    pairs = sorted(a / b for a, b in zip(rows["tau2"], ddp))
    assert ttq.compute_ratio(compute, "tau2") == (pytest.approx((pairs[4] + pairs[5]) / 2), "paired")
    assert ttq.compute_ratio(compute, "tau2")[0] == pytest.approx(1.50, abs=0.005)
    cost = ttq.row_cost(compute, "tau2")
    assert cost["compute_s"] == pytest.approx(1.50 * min(ddp), rel=4e-3) and cost["priced_by"] == "paired"
    assert ttq.row_cost(compute, "ddp")["compute_s"] == min(ddp)  # the reference: its own fastest block
    assert ttq.fastest_priced(compute) == []
    del compute["tau2"]["ddp_blocks_s"]  # written before rows kept a copy: DDP's own blocks, same session
    assert ttq.row_cost(compute, "tau2")["compute_s"] == pytest.approx(cost["compute_s"])
    compute["tau2"]["session"] = "s0"  # another session, DDP's blocks of it unknown: its fastest block
    assert ttq.compute_ratio(compute, "tau2") == (pytest.approx(10.27 / 8.67), "fastest")
    assert ttq.row_cost(compute, "tau2")["priced_by"] == "fastest"
    assert ttq.fastest_priced(compute) == ["tau2 (1.18x)"] and ttq.fastest_priced(compute, ["tau1"]) == []


def test_a_decode_timed_while_the_machine_was_busy_does_not_count(ttq, tmp_path, monkeypatch):
    """``decode_s`` is the fastest of several timings of one round's decode: a slow call (a busy
    neighbour) during the measurement does not raise it. The CPU clock is scripted (every third decode
    takes three units, the others one), so the check holds on a loaded machine too: one unit over the
    round's 4 payloads (wire_costs runs 4 workers), where the mean of the timings would be about 1.6."""
    from gradwire.averaging.compressed import CompressedMean

    original, calls, clock = CompressedMean.decode_mean, [], [0.0]

    def sometimes_slow(self, buffers, like):
        calls.append(1)
        clock[0] += 3.0 if len(calls) % 3 == 0 else 1.0
        return original(self, buffers, like)

    monkeypatch.setattr(CompressedMean, "decode_mean", sometimes_slow)
    monkeypatch.setattr(ttq.time, "process_time", lambda: clock[0])
    decode_s = ttq.wire_costs(ttq.ROW["muloco-k96-h3"], 0.002, 100, tmp_path / "busy")["decode_s"]
    assert ttq.DECODE_REPEATS >= 3 and len(calls) > ttq.DECODE_REPEATS
    assert decode_s == pytest.approx(1.0 / 4)


def test_a_server_row_steps_by_rounds_of_h_on_ddps_schedule_and_evaluation_grid(ttq):
    """backup-diloco and async-diloco run in server mode, a step of the run an outer round of H inner
    steps a replica: N/H rounds, the replicas' schedule spanning N inner updates with DDP's warm-up
    (the algorithm's schedule counts --steps × H: tests/algorithms/test_backup_diloco.py), evaluated
    where the inner steps cross DDP's grid of samples."""
    from gradwire.algorithms.base import ALGORITHMS

    n, base = 1000, (lambda step, every, h: step % every == 0 or step == h)
    ddp_grid = [s for s in range(1, 2 * n + 1) if ttq.evaluates_here(ttq.ROW["ddp"], s, n, base)]
    for key in ("backup-diloco", "async-diloco"):
        row = ttq.ROW[key]
        h = ALGORITHMS.build(row.algorithm).inner_steps
        assert row.inner_steps == row.batches_per_step == h == ttq.H and row.collective == "server"
        spec, horizon = ttq.schedule(row, n)
        assert horizon == n // h and spec == ttq.schedule(ttq.ROW["ddp"], n)[0]
        grid = [s for s in range(1, 2 * horizon + 1) if ttq.evaluates_here(row, s, horizon, base)]
        assert horizon in grid and grid[-1] == 2 * horizon
        late = [s * h for s in grid if s * h > n // 2 + 2 * ttq.EVAL_EVERY]
        ddp_late = [s for s in ddp_grid if s > n // 2 + 2 * ttq.EVAL_EVERY]
        assert len(late) == len(ddp_late) and all(0 <= a - b < h for a, b in zip(late, ddp_late))


def test_a_server_rounds_time_is_the_simulators_over_the_servers_link(ttq):
    """A server-mode row's step is the simulator's round: with b = 0 and no straggler, the n answers
    leave the server's link one after another, each replica computes on arrival, and the last upload
    arrives a latency after it has gone out: c + 2 latency + (n + 1) B / bw in the steady state (ps's
    ServerLink), B = θ's message. A backup round waits for n - 1 uploads, so it is shorter."""
    from gradwire.algorithms.protocol import HEADER_BYTES

    b = HEADER_BYTES + 4 * 137_216
    for n, mbps in ((4, 100.0), (3, 10.0)):
        t = ttq.server_round_seconds(f"backup-diloco:backups=0,inner_steps={ttq.H}", 0.2, n, mbps)
        assert t == pytest.approx(0.2 + 2 * ttq.LATENCY_MS / 1e3 + (n + 1) * b / (mbps * 1e6 / 8), rel=1e-9)
        assert ttq.server_round_seconds(f"backup-diloco:backups=1,inner_steps={ttq.H}", 0.2, n, mbps) < t
    row = ttq.ROW["backup-diloco"]
    cost = measured(0.2, payload_bytes=b, answer_bytes=b, ddp_compute_s=0.01)
    assert ttq.step_seconds(row, cost, 4, None) == 0.2
    assert ttq.step_seconds(row, cost, 4, 100.0) == ttq.server_round_seconds(row.algorithm, 0.2, 4, 100.0)


def test_a_server_rows_table_line_is_in_inner_steps_and_its_time_in_rounds(ttq):
    """A server-mode row's curve is in rounds of H; its line shows DDP's unit, inner steps (steps to
    the target, bits and CPU per step), while its time is its rounds times the simulator's round."""
    h, rounds = ttq.H, [5, 10, 15, 20]
    curve = dict(steps=rounds, params=137_216, bytes=[1, 2, 3, 4])
    results = {"ddp": [dict(curve, steps=[100, 200, 300, 400], losses=[3.0, 2.5, 2.1, 2.0])],
               "backup-diloco": [curve | dict(losses=[2.8, 2.4, 2.0, 1.9])]}
    b = 4 * 137_216 + 64
    compute = {"ddp": measured(), "backup-diloco": measured(0.2, payload_bytes=b, answer_bytes=b)}
    line = next(x for x in ttq.table_rows(2.05, results, compute, 4) if x["key"] == "backup-diloco")
    assert line["steps"][0] == pytest.approx(h * 14.375)  # 7/8 of the way from round 10 to 15
    # every byte of the round on the replica's link: its upload and the server's answer
    assert line["cpu_ms"] == pytest.approx(1e3 * 0.2 / h) and line["bits_per_param_step"] == pytest.approx(
        2 * 8 * b / 137_216 / h)
    assert line["bits_per_param_round"] == pytest.approx(2 * 8 * b / 137_216)
    assert "| 32 up + 32 down |" in ttq.markdown([line], 4, 2.05)
    round_s = ttq.server_round_seconds(ttq.ROW["backup-diloco"].algorithm, 0.2, 4, 100.0)
    assert line["t@100.0"][0] == pytest.approx(14.375 * round_s) and line["t@None"][0] == pytest.approx(14.375 * 0.2)


def test_a_server_rows_wire_is_every_upload_and_answer_the_ledger_counts(ttq, tmp_path):
    """The Δ each replica uploads and the θ the server answers with, uncompressed: header and 32 bits
    a parameter each, their sum the ledger's; the compute stage times backup-diloco at b = 0, which
    one worker can run (b = 1 needs two)."""
    from gradwire.algorithms.protocol import HEADER_BYTES

    wire = ttq.wire_costs(ttq.ROW["backup-diloco"], 0.004, 1000, tmp_path / "w")
    assert wire["payload_bytes"] == wire["answer_bytes"] == HEADER_BYTES + 4 * 137_216
    assert wire["decode_s"] == 0.0 == wire["size_exchanges"]
    assert ttq.ROW["backup-diloco"].compute_algorithm.startswith("backup-diloco:backups=0,")
    ttq._sim_stepper(ttq.ROW["backup-diloco"], 0.004, 1000, tmp_path / "c")()  # one round on one worker


def test_a_compressed_server_row_prices_its_codecs_bytes_both_ways(ttq, tmp_path):
    """The 1-bit rows send the scaled sign up (with error feedback) and θ's change through it down
    (answer=change): both messages are the codec's payload and the header, and the simulator's round
    prices those bytes, not θ's."""
    import torch

    from gradwire.algorithms.protocol import HEADER_BYTES
    from gradwire.compress import build

    row = ttq.ROW["backup-diloco-sign"]
    wire = ttq.wire_costs(row, 0.004, 1000, tmp_path / "w")
    sign = HEADER_BYTES + build("sign:scaled=true").encode(torch.zeros(137_216)).buffer.numel()
    assert wire["payload_bytes"] == wire["answer_bytes"] == sign
    cost = measured(0.2, payload_bytes=sign, answer_bytes=sign)
    compressed = ttq.server_round_seconds(row.algorithm, 0.2, 4, 10.0, compressor="sign:scaled=true",
                                          error_feedback=True)
    assert ttq.step_seconds(row, cost, 4, 10.0) == compressed
    dense = ttq.server_round_seconds(f"backup-diloco:backups=0,inner_steps={ttq.H},answer=change", 0.2, 4, 10.0)
    assert compressed < 0.3 < dense  # 1 bit a parameter each way against 32


def test_a_scatter_row_s_wire_is_its_whole_message_and_its_rounds_at_every_worker_count(ttq, tmp_path, monkeypatch):
    """A scatter row (--compressed-mean scatter) sends its message in n slots twice a round: the ledger's
    count over ``ledger_divisor`` is one worker's n slots (4 workers: 4 chunks of 34,304 elements at 1
    bit and a float32 scale each); its round's averaging is measured at 1, 4, 16 and 64 workers, each
    with that many chunks; no payload of its round is decoded whole (``decode_s`` 0)."""
    seen = []
    measure = ttq.scatter_round_seconds

    def recorded(averager, numel, workers, repeats=ttq.DECODE_REPEATS):
        seen.append((averager.compressor.spec(), averager.ef is not None, numel, workers))
        return measure(averager, numel, workers, repeats=1)

    monkeypatch.setattr(ttq, "scatter_round_seconds", recorded)
    wire = ttq.wire_costs(ttq.ROW["muloco-sign-h3-tau1-carry-mu0.9-scatter"], 0.004, 1000, tmp_path / "w")
    assert wire["payload_bytes"] == 4 * (34_304 // 8 + 4) and wire["decode_s"] == 0.0
    assert sorted(wire["scatter_round_s"], key=int) == ["1", "4", "16", "64"]
    assert all(s > 0 for s in wire["scatter_round_s"].values())
    assert seen == [("sign:scaled=true", True, 137_216, n) for n in (1, 4, 16, 64)]


def test_a_seed_run_alone_is_judged_against_the_target_of_every_ddp_seed_given(ttq, tmp_path, monkeypatch):
    """``curves --seeds 2 --target-seeds 1,2,3`` (a row's seeds as separate processes): the target is
    the mean of DDP's qualities at N over the target seeds, not seed 2's own; without the flag the
    target is the given seeds'; a target seed that tunes is refused before anything runs."""
    import json

    n = 100
    steps = list(range(20, 2 * n + 1, 20))
    at_n = {1: 2.0, 2: 2.3, 3: 2.9}  # each DDP seed's loss at every evaluation: its quality at N
    for seed, quality in at_n.items():
        folder = ttq.run_folder(tmp_path, ttq.ROW["ddp"], 0.004, seed, 2)
        folder.mkdir(parents=True)
        (folder / "curve.json").write_text(json.dumps({"steps": steps, "losses": [quality] * len(steps)}))
    (tmp_path / "tuning").mkdir()
    for key in ("ddp", "muloco-sign-h3-tau1-carry"):
        (tmp_path / "tuning" / f"{key}.json").write_text(json.dumps({key: 0.004}))
    targets = []
    monkeypatch.setattr(ttq, "train", lambda row, lr, seed, *a, target=None, **k: targets.append((seed, target)))
    argv = ["curves", "--rows", "muloco-sign-h3-tau1-carry", "--seeds", "2", "--n-steps", str(n), "--workers", "2",
            "--out", str(tmp_path)]
    assert ttq.main([*argv, "--target-seeds", "1,2,3"]) == 0
    assert targets == [(2, pytest.approx(sum(at_n.values()) / 3))]
    assert ttq.main(argv) == 0
    assert targets[1] == (2, pytest.approx(at_n[2]))
    with pytest.raises(ValueError, match="tuning seed 0 is also a table seed"):
        ttq.main([*argv, "--target-seeds", "0,1"])
    with pytest.raises(SystemExit):  # one parser error naming the flag, as --seeds gives
        ttq.main([*argv, "--target-seeds", "1,x"])
    assert len(targets) == 2


def test_the_rows_named_for_muloco_s_defaults_run_them_and_the_others_the_measured_settings(ttq):
    """The -mu0.9 rows (-mu0.9-scatter too) take MuLoCo's inner defaults (what a user gets), every other MuLoCo row the
    settings the earlier passes measured (MULOCO_MEASURED): both written into the row's spec, so a later
    change of MuLoCo's defaults changes no row; and MULOCO_DEFAULTS still says what the defaults are."""
    from gradwire.algorithms.muloco import MuLoCo
    from gradwire.spec import parse_spec

    defaults = MuLoCo()
    keys = dict(kv.split("=") for kv in ttq.MULOCO_DEFAULTS.split(","))
    assert float(keys["muon_momentum"]) == defaults.muon_momentum and float(keys["beta2"]) == defaults.betas[1]
    muloco_rows = [row for row in ttq.ROWS if row.algorithm.startswith("muloco:")]
    for row in muloco_rows:
        spec = parse_spec(row.algorithm)[1]
        settings = (float(spec["muon_momentum"]), float(spec["beta2"]))
        assert settings == ((0.9, 0.99) if "-mu0.9" in row.key else (0.95, 0.95)), row.key
    assert sum(row.key.endswith("-mu0.9") for row in muloco_rows) == 5
    assert sum(row.key.endswith("-mu0.9-scatter") for row in muloco_rows) == 8  # H 3 τ 0-3, two sub-bit, H 6 τ 3-4
