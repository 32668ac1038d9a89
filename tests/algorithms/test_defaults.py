"""Defaults that learn: --lr, --momentum and --lr-schedule left out are the algorithm's own, the step
times the task's scale where it is a gradient's, or the algorithm's own rate on a task it names
(run.combination.resolved), and every algorithm on its defaults
learns on the default task (mnist1d-mlp, 8 workers, 500 steps): each above a floor a few points under
what it reached on seed 0 in docs/defaults.md, and those that clear 90 % of learning-rate-tuned sync
SGD there by a wide margin clear it here (one seed here, three in the doc's table)."""

from __future__ import annotations

import json

import pytest

from gradwire.algorithms import ALGORITHMS
from gradwire.config import RunConfig
from gradwire.errors import ConfigError
from gradwire.run.combination import resolved
from gradwire.run.loop import run
from gradwire.tasks import TASKS
from gradwire.tasks.base import default_lr_scale

# docs/defaults.md: sync SGD at its best learning rate on the held-out seeds (1.6, momentum 0), mean
# final test accuracy over seeds 0, 1, 2
TUNED_SYNC = 0.697
BAR = 0.9 * TUNED_SYNC  # the bar: 90 % of tuned sync, 0.627
# The same run on two CPUs ends a few test samples apart, more at high rates and where a stochastic
# quantizer turns a last-bit difference into other random draws: between the machine of the earlier
# table and this one (docs/defaults.md, "The tests") sync moved by up to 21 of the 1,000 test samples,
# Leader SGD 23, DQ-GD 66. So each floor is its seed-0 accuracy in the doc's table less 5 points
# (less 10 for the stochastically quantized DIANA, DQ-GD and DQ-SGD), rounded down: a default that stops
# learning fails (chance is 0.10), another CPU's rounding does not. Async SGD too takes 10: PyTorch's avx2
# kernels on the same machine moved its seed 0 by 52 samples (0.704 -> 0.652, docs/defaults.md), and Leader SGD
# takes 10 too (its seed 0 at its rate of the sixth round, 1.6: 0.585 on the Xeon of the earlier rounds, 0.615
# on the AMD EPYC of the sixth; the lower less 10). signSGD (since the tenth round rank 0's error-fed reply,
# --lr 0.02 decayed linearly, β 0.8): its seed 0 0.639 on the AMD EPYC, less 5. The tenth round's other changes,
# seed 0 on the AMD EPYC: DAGC at its own 2.0 on the default task 0.653, less 5; DIANA at its own 1.2 0.633, less
# 10 (a random quantizer: the floor it had); SparseLoCo at its inner 0.03 0.655, less 5.
FLOOR = {"sync": 0.64, "async": 0.60, "local": 0.64, "dasgd": 0.64, "easgd": 0.61, "lsgd": 0.48, "dagc": 0.60,
         "dqsgd": 0.57, "diana": 0.53, "dqgd": 0.56, "async-diloco": 0.61, "signsgd": 0.58, "diloco": 0.61,
         "streaming-diloco": 0.58, "backup-diloco": 0.59, "muloco": 0.56, "sparseloco": 0.60, "demo": 0.58}
# those whose defaults clear BAR on seed 0 by at least 30 test samples, quantizing nothing at random,
# must clear it anywhere; the others are held to their floor
MEETS_BAR = {"sync", "async", "local", "dasgd", "easgd", "diloco", "async-diloco"}


def test_left_out_lr_and_momentum_are_the_algorithms_own(tmp_path, data_dir):
    cfg = RunConfig()
    assert cfg.lr is None and cfg.momentum is None
    for name in ALGORITHMS.names():
        algorithm = ALGORITHMS.build(name)
        filled = resolved(RunConfig(algorithm=name, task="digits-mlp"))  # a task of scale 1
        assert (filled.lr, filled.momentum) == (algorithm.default_lr, algorithm.default_momentum), name
        # the default task takes twice a gradient step; AdamW's and a sign's steps, and async's, are its own;
        # an algorithm's own rate on a task it names replaces both (Leader SGD's)
        scale = 2.0 if algorithm.lr_scales_with_task else 1.0
        own = algorithm.default_lr_on_task.get("mnist1d-mlp", algorithm.default_lr * scale)
        assert resolved(RunConfig(algorithm=name)).lr == own, name
    assert resolved(RunConfig(lr=0.3, momentum=0.5)).lr == 0.3  # given: kept
    assert resolved(RunConfig(optimizer="adamw")).momentum == 0.0  # AdamW keeps its own moments
    out = tmp_path / "run"
    run(RunConfig(task="digits-logreg", workers=2, steps=2, out=str(out), data_dir=str(data_dir)), progress=False)
    written = json.loads((out / "config.json").read_text())
    assert (written["lr"], written["momentum"]) == (ALGORITHMS.build("sync").default_lr, 0.0)


def test_a_left_out_lr_schedule_is_the_algorithms_own_and_config_json_records_it(tmp_path, data_dir, monkeypatch):
    assert RunConfig().lr_schedule is None
    for name in ALGORITHMS.names():
        assert resolved(RunConfig(algorithm=name)).lr_schedule == ALGORITHMS.build(name).default_lr_schedule, name
        assert resolved(RunConfig(algorithm=name, lr_schedule="cosine")).lr_schedule == "cosine", name  # given: kept
    # a class whose default is a decay runs exactly as the same decay given on the command line
    monkeypatch.setattr(type(ALGORITHMS.build("sync")), "default_lr_schedule", "linear")
    common = dict(task="digits-logreg", workers=2, steps=4, eval_every=1, data_dir=str(data_dir))
    assert resolved(RunConfig(**common, lr=0.1, momentum=0.0)).lr_schedule == "linear"  # lr given: still filled in
    left_out, given = tmp_path / "left-out", tmp_path / "given"
    run(RunConfig(**common, out=str(left_out)), progress=False)
    run(RunConfig(**common, out=str(given), lr_schedule="linear"), progress=False)
    assert json.loads((left_out / "config.json").read_text())["lr_schedule"] == "linear"
    lines = [(folder / "metrics.jsonl").read_text().splitlines() for folder in (left_out, given)]
    strip = [[{k: v for k, v in json.loads(line).items() if "time" not in k} for line in ls] for ls in lines]
    assert strip[0] == strip[1] and len(strip[0]) >= 4
    constant = tmp_path / "constant"  # and differs from the constant rate
    run(RunConfig(**common, out=str(constant), lr_schedule="constant"), progress=False)
    last = [json.loads((f / "metrics.jsonl").read_text().splitlines()[-1])["train_loss"] for f in (left_out, constant)]
    assert last[0] != last[1]


def test_the_task_scales_the_default_gradient_step_and_config_json_records_the_product(tmp_path, data_dir):
    assert default_lr_scale("mnist1d-mlp") == 2.0
    assert default_lr_scale("mnist1d-cnn") == 0.75
    assert default_lr_scale("stdlib-lm") == 0.0375
    assert {default_lr_scale(t) for t in TASKS.names() if t not in ("mnist1d-mlp", "mnist1d-cnn", "stdlib-lm")} == {1.0}
    sync = ALGORITHMS.build("sync").default_lr
    assert resolved(RunConfig()).lr == 2 * sync and resolved(RunConfig(task="mnist1d-cnn")).lr == 0.75 * sync
    assert resolved(RunConfig(optimizer="adamw")).lr == sync  # AdamW's step is not a gradient's
    assert resolved(RunConfig(lr=0.3)).lr == 0.3  # given: as given, whatever the task
    with pytest.raises(ConfigError, match=r"mnist1d-mlpp.*\(--task\)$"):
        resolved(RunConfig(task="mnist1d-mlpp"))
    out = tmp_path / "run"
    run(RunConfig(workers=2, steps=2, out=str(out), data_dir=str(data_dir)), progress=False)
    assert json.loads((out / "config.json").read_text())["lr"] == 2 * sync


def test_an_algorithms_own_rate_on_a_task_replaces_the_tasks_scale_there_only(tmp_path, data_dir):
    lsgd = ALGORITHMS.build("lsgd")
    assert dict(lsgd.default_lr_on_task) == {"mnist1d-mlp": 1.6}  # docs/defaults.md, sixth round
    assert resolved(RunConfig(algorithm="lsgd")).lr == 1.6  # not 0.6 x the task's 2
    assert resolved(RunConfig(algorithm="lsgd:pull=0.2")).lr == 1.6  # whatever its keys
    assert resolved(RunConfig(algorithm="lsgd", task="mnist1d-cnn")).lr == 0.75 * lsgd.default_lr  # elsewhere: scaled
    assert resolved(RunConfig(algorithm="lsgd", lr=0.3)).lr == 0.3  # given: as given
    assert resolved(RunConfig(algorithm="lsgd", optimizer="adamw")).lr == lsgd.default_lr  # an SGD rate only
    # DAGC's and DIANA's too (tenth round): the MLP learns more at a rate their CNN would not hold
    assert {name: dict(ALGORITHMS.build(name).default_lr_on_task) for name in ALGORITHMS.names()
            if ALGORITHMS.build(name).default_lr_on_task} == {"lsgd": {"mnist1d-mlp": 1.6},
                                                              "dagc": {"mnist1d-mlp": 2.0},
                                                              "diana": {"mnist1d-mlp": 1.2}}
    out = tmp_path / "run"
    run(RunConfig(algorithm="lsgd", workers=2, steps=2, out=str(out), data_dir=str(data_dir)), progress=False)
    assert json.loads((out / "config.json").read_text())["lr"] == 1.6


def test_floors_cover_every_algorithm():
    assert set(FLOOR) == set(ALGORITHMS.names()) and MEETS_BAR <= set(FLOOR)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FLOOR))
def test_every_algorithm_learns_on_its_defaults(name, tmp_path, data_dir):
    summary = run(RunConfig(algorithm=name, out=str(tmp_path / "run"), data_dir=str(data_dir), curves=False),
                  progress=False)
    acc = summary["final"]["test_acc"]
    assert acc >= FLOOR[name], (name, acc, FLOOR[name])
    if name in MEETS_BAR:
        assert acc >= BAR, (name, acc, BAR)


@pytest.mark.slow
def test_scaled_signs_with_error_feedback_clear_the_bar_that_signsgds_vote_misses(tmp_path, data_dir):
    """docs/defaults.md, "What limits signSGD": one bit a coordinate up, with the magnitude the vote
    drops kept by a scale and error feedback (Karimireddy et al. 2019), on sync's defaults: 0.679 on
    seed 0 there (the vote: 0.599), deterministic, 52 samples above the bar."""
    summary = run(RunConfig(algorithm="sync", compressor="sign:scaled=true", error_feedback=True,
                            out=str(tmp_path / "run"), data_dir=str(data_dir), curves=False), progress=False)
    assert summary["final"]["test_acc"] >= BAR, summary["final"]["test_acc"]


@pytest.mark.slow
def test_signsgds_error_fed_reply_learns_more_than_the_majority_vote_on_the_default_task(tmp_path, data_dir):
    """docs/defaults.md, tenth round: the same workers' votes, rank 0's reply changed. Seed 0: 0.639 with
    the default reply against the vote's 0.599 (its defaults before: down=vote, β 0.9, --lr 0.003), 40
    test samples; under PyTorch's avx2 and default kernels 0.652 / 0.640 against 0.600 / 0.591."""
    accs = {}
    for spec in ("signsgd", "signsgd:down=vote,momentum=0.9"):
        summary = run(RunConfig(algorithm=spec, out=str(tmp_path / spec.replace(":", "_")), data_dir=str(data_dir),
                                curves=False), progress=False)
        accs[spec] = summary["final"]["test_acc"]
    assert accs["signsgd"] >= accs["signsgd:down=vote,momentum=0.9"] + 0.02, accs
