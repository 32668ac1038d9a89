"""Validation in two stages: ``RunConfig.validate`` checks each value and name on its own;
``check_combination`` (run/combination.py) asks the components whether they work together. Each
refusal of the second stage is here, in one line that names the value and its flag, and each is
one the first stage lets through (so the second is where it is made)."""

import importlib.util
import re

import pytest

from gradwire.config import RunConfig
from gradwire.errors import ConfigError
from gradwire.run.combination import Combination, check_combination, resolved

LM = "stdlib-lm:dim=8,layers=1,heads=2,context=6,train_bytes=4000,val_bytes=700"
FT = "torchft:min_replicas=2,timeout_s=10,lighthouse=127.0.0.1:29510,replica=1"
TP = dict(task=LM, backend="torch", workers=2, tensor_parallel="1d:p=2", batch_size=4)

# (the config's values, words of the one-line refusal, the flag it ends with)
REFUSALS = [
    (dict(error_feedback=True), "--error-feedback needs --compressor: algorithm 'sync'", "--compressor topk:ratio=0.01 "
                                                                                         "--error-feedback)"),
    (dict(lr_schedule="cosine:warmup=5", steps=5), "warms up over 5 steps, but the run has only --steps 5",
     "(--lr-schedule)"),
    (dict(nesterov=True), "nesterov=true needs momentum > 0", "(--nesterov)"),  # sync's own momentum is 0
    (dict(kernels="triton"), "runs only under Triton's interpreter", "(--kernels)"),
    (dict(algorithm="sync:backups=-1"), "backups must be >= 0, got -1", "(--algorithm)"),
    (TP | dict(backend="threads"), "tensor_parallel='1d:p=2' needs --backend torch", "(--tensor-parallel)"),
    (TP | dict(algorithm="sync:backups=1"), "algorithm 'sync:backups=1' has a server", "(--tensor-parallel)"),
    (TP | dict(algorithm="sync:overlap=true"), "averages during the backward pass", "(--tensor-parallel)"),
    (TP | dict(task="digits-mlp"), "task 'digits-mlp' has none", "(--tensor-parallel)"),
    (TP | dict(tensor_parallel="2d:q=3"), "dim=8 and heads=2 must be multiples of 3", "(--tensor-parallel)"),
    (TP | dict(optimizer="muon"), "--optimizer 'muon' orthogonalises each weight matrix whole, but each process "
     "holds only a block of it; use --optimizer sgd or adamw", "(--tensor-parallel)"),
    (TP | dict(tensor_parallel="2d:q=2", optimizer="muon:ns_steps=3"), "--optimizer 'muon:ns_steps=3'",
     "(--tensor-parallel)"),
    (TP | dict(algorithm="muloco"), "algorithm 'muloco' updates each weight matrix whole (Muon), but each process "
     "holds only a block of it; use diloco (inner=adamw or sgd)", "(--tensor-parallel)"),
    (TP | dict(tensor_parallel="2d:q=2", workers=1, batch_size="full"),  # LM's 4000 bytes: 571 windows of 7
     "worker 0's 571 sequences are not a multiple of 2 (shards: [571])", "(--tensor-parallel)"),
    (dict(backend="torch", workers=3, fault_tolerance=FT, algorithm="async"), "server-mode algorithms",
     "(--fault-tolerance)"),
    (dict(backend="torch", workers=3, fault_tolerance=FT, algorithm="streaming-diloco:overlap=1"),
     "use streaming-diloco with overlap=0 and no eager", "(--fault-tolerance)"),
    (TP | dict(fault_tolerance=FT), "--tensor-parallel are not supported with it", "(--fault-tolerance)"),
    # a run that ends before the first change of the model its algorithm evaluates (Algorithm.evaluated_rounds)
    (dict(algorithm="muloco", workers=4, steps=12), "steps=12 < inner_steps=20: no outer round of algorithm 'muloco' "
     "would complete", "raise --steps to 20 or more, or lower inner_steps (--steps)"),
    (dict(algorithm="diloco", backend="threads", workers=3, steps=8), "steps=8 < inner_steps=10", "(--steps)"),
    (dict(algorithm="sparseloco", steps=4), "steps=4 < inner_steps=5", "(--steps)"),
    (dict(algorithm="muloco:overlap=2", steps=21), "steps=21 < inner_steps=20 + overlap=2", "(--steps)"),
    (dict(algorithm="streaming-diloco", steps=5), "steps=5 < inner_steps/fragments=20/4 + overlap=1", "(--steps)"),
    (dict(algorithm="streaming-diloco:inner_steps=10,fragments=3,eager=true", steps=2),
     "steps=2 < ⌊inner_steps/fragments=10/3⌋: no outer round", "(--steps)"),
    (dict(algorithm="local", steps=3), "steps=3 < period=4: no averaging of algorithm 'local'", "(local:eval=average) "
                                                                                               "(--steps)"),
    (dict(algorithm="dasgd", steps=4), "steps=4 < period=4 + delay=1", "(--steps)"),
    (dict(algorithm="easgd", steps=1), "steps=1 < period=2: no communication round", "(--steps)"),
    # --nesterov where the algorithm's momentum is not --momentum's: said so, not "needs momentum > 0"
    (dict(algorithm="diloco", nesterov=True), "--nesterov does not apply to algorithm 'diloco' (leave it off): its "
     "inner optimizer is AdamW", "(--algorithm diloco:inner=sgd --momentum 0.9 --nesterov) (--nesterov)"),
    (dict(algorithm="sparseloco", nesterov=True, momentum=0.9), "does not apply to algorithm 'sparseloco'",
     "(--nesterov)"),
    (dict(algorithm="backup-diloco", nesterov=True), "does not apply to algorithm 'backup-diloco'", "(--nesterov)"),
    (dict(algorithm="muloco", nesterov=True), "does not apply to algorithm 'muloco' (leave it off): its inner Muon "
     "takes its Nesterov form and momentum from the spec (muloco:nesterov=true", "(--nesterov)"),
    (dict(algorithm="demo", nesterov=True), "does not apply to algorithm 'demo'", "(--nesterov)"),
    (dict(algorithm="diana", nesterov=True), "does not apply to algorithm 'diana'", "(--nesterov)"),
    (dict(algorithm="signsgd", nesterov=True), "does not apply to algorithm 'signsgd'", "(--nesterov)"),
    (dict(algorithm="diloco:inner=sgd", nesterov=True), "nesterov=true needs momentum > 0", "(--nesterov)"),
    # a --momentum 0 given: the first stage said "needs momentum > 0", not that --nesterov does not apply
    (dict(algorithm="diloco", nesterov=True, momentum=0.0), "--nesterov does not apply to algorithm 'diloco' (leave "
     "it off): its inner optimizer is AdamW", "(--algorithm diloco:inner=sgd --momentum 0.9 --nesterov) (--nesterov)"),
    (dict(nesterov=True, momentum=0.0), "nesterov=true needs momentum > 0 (--momentum 0.9 --nesterov), got momentum=0",
     "(--nesterov)"),
    (dict(backend="torch", workers=3, fault_tolerance=FT, timeout_s=5), "timeout_s=10 exceeds --timeout-s 5",
     "(--fault-tolerance)"),
]


@pytest.mark.parametrize("values, says, ends", REFUSALS, ids=[r[1][:32] for r in REFUSALS])
def test_each_refusal_is_made_by_the_second_stage_in_one_line(values, says, ends, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cfg = RunConfig(out=str(tmp_path / "run"), **values)
    assert cfg.validate() is cfg  # each value is fine on its own
    with pytest.raises(ConfigError) as e:
        check_combination(cfg)
    message = str(e.value)
    assert says in message and message.endswith(ends) and "\n" not in message, message


def test_kernels_that_are_not_installed_are_refused(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    cfg = RunConfig(kernels="triton", out=str(tmp_path / "run")).validate()
    with pytest.raises(ConfigError, match=r"^kernels=triton: Triton is not installed; .* \(--kernels\)$"):
        check_combination(cfg)


@pytest.mark.parametrize("values, message, flag", [
    (dict(kernels="tpu"), "kernels='tpu': valid choices are torch, triton", "--kernels"),
    (dict(tensor_parallel="3d:p=2"), "unknown layout '3d'; valid: 1d:p=P", "--tensor-parallel"),
    (dict(algorithm="synk"), "unknown algorithm 'synk'; valid algorithms: async,", "--algorithm"),
    (dict(compressor="qsgd:level=4"), "compressor 'qsgd' has no parameter 'level'", "--compressor"),
    (dict(compressor="powersgdd"), "unknown compressor 'powersgdd'; valid compressors are", "--compressor"),
    (dict(lr_schedule="cosine:warmup=-1"), "warmup", "--lr-schedule"),
])
def test_the_first_stage_refuses_names_on_their_own_naming_the_flag(values, message, flag, tmp_path):
    with pytest.raises(ConfigError) as e:
        RunConfig(out=str(tmp_path / "run"), **values).validate()
    assert message in str(e.value) and str(e.value).endswith(f"({flag})"), str(e.value)


def test_what_passes_comes_back_resolved_with_the_algorithms_answers(tmp_path):
    out = str(tmp_path / "run")
    plain = check_combination(RunConfig(out=out, workers=3))
    assert plain == Combination(resolved(RunConfig(out=out, workers=3)), needs_server=False)
    assert plain.cfg.lr is not None and plain.cfg.momentum is not None
    server = check_combination(RunConfig(out=out, workers=3, backend="torch", algorithm="sync:backups=1"))
    assert (server.needs_server, server.processes) == (True, 4)  # three workers and the server
    split = check_combination(RunConfig(out=out, **TP))
    assert (split.needs_server, split.processes) == (False, 4)  # two workers of two processes each
    ft = check_combination(RunConfig(out=out, backend="torch", workers=3, fault_tolerance=FT,
                                     algorithm="streaming-diloco:overlap=0"))
    assert ft.cfg.fault_tolerance == FT and not ft.needs_server
    assert check_combination(RunConfig(out=out, error_feedback=True, algorithm="dqgd")).cfg.error_feedback


# (algorithm, the first step after which the model it evaluates changes): DiLoCo's θ at its first round's
# end, H (muloco 20, sparseloco 5), plus τ steps in flight; Streaming DiLoCo's first fragment due at
# ⌊H/P⌋ (20/4) plus τ = 1, eager at once; local SGD's last average every τ = 4 steps, DaSGD's d = 1 later;
# EASGD's center every τ = 2; the others' evaluated parameters move at every step
FIRST_CHANGES = [("diloco", 10), ("muloco", 20), ("sparseloco", 5), ("muloco:overlap=2", 22),
                 ("streaming-diloco", 6), ("streaming-diloco:eager=true", 5), ("streaming-diloco:fragments=1", 21),
                 ("local", 4), ("dasgd", 5), ("dasgd:delay=0", 4), ("easgd", 2), ("local:eval=average", 1),
                 ("easgd:eval=each", 1), ("sync", 1), ("demo", 1), ("backup-diloco", 1), ("async-diloco", 1),
                 ("dagc:local_steps=3", 1), ("lsgd", 1)]


@pytest.mark.parametrize("algorithm, first", FIRST_CHANGES, ids=[a for a, _ in FIRST_CHANGES])
def test_a_run_refused_for_its_steps_is_exactly_one_that_would_evaluate_the_initial_model(algorithm, first, tmp_path):
    """Measured (a run of first - 1 steps ends on the initial model's metrics, one of first steps does not)
    when the bound was written; here the refusal's edge: first - 1 steps refused, first steps not."""
    cfg = RunConfig(out=str(tmp_path / "run"), algorithm=algorithm, workers=2, steps=first)
    assert check_combination(cfg).cfg.steps == first
    if first > 1:
        with pytest.raises(ConfigError, match=rf"^steps={first - 1} < .* raise --steps to {first} or more, .*"
                                              r"\(--steps\)$"):
            check_combination(cfg.replace(steps=first - 1))


@pytest.mark.parametrize("algorithm, steps, says", [
    ("diloco", 25, "the last outer round of algorithm 'diloco' is incomplete: its 5 steps after step 20 will not "
                   "reach the evaluated model, which changes only at outer rounds (this run's last after step 20); "
                   "--steps 20 or 30 ends on one"),
    ("muloco:overlap=2", 30, "its 10 steps after step 20 will not reach the evaluated model"),  # merged at 22
    ("dasgd", 10, "its 2 steps after step 8 will not reach"),  # averages started at 4 and 8, merged at 5 and 9
    ("local", 5, "the last averaging of algorithm 'local' is incomplete: its 1 step after step 4 will not reach"),
    # after the merge at 497: steps 497 (computed while it travelled) and 498
    ("dasgd", 498, "the last averaging of algorithm 'dasgd' is incomplete: its 2 steps after step 496 will not reach "
                   "the evaluated model, which changes only at averagings (this run's last after step 497); --steps "
                   "497 or 501 ends on one (the 1 step computed while it travels stays outside it"),
    ("dasgd:delay=2", 11, "its 3 steps after step 8 will not reach"),  # merged at 10, the next starts at 12
    # a run that ends while its last round travels leaves out more than the delay's steps: that round is never
    # merged (DaSGD's defaults: the averaging of step 500; a review found these unnoted for a while)
    ("dasgd", 500, "its 4 steps after step 496 will not reach the evaluated model"),
    ("dasgd", 12, "its 4 steps after step 8 will not reach"),
    ("dasgd:delay=2", 9, "its 5 steps after step 4 will not reach"),
    ("muloco:overlap=2", 40, "its 20 steps after step 20 will not reach"),
    ("dasgd:delay=4", 501, "its 5 steps after step 496 will not reach"),
])
def test_an_incomplete_last_round_is_noted_not_refused(algorithm, steps, says, tmp_path):
    notes = check_combination(RunConfig(out=str(tmp_path / "run"), algorithm=algorithm, workers=2, steps=steps)).notes
    assert len(notes) == 1 and says in notes[0] and "\n" not in notes[0], notes


@pytest.mark.parametrize("algorithm, steps", [("diloco", 30), ("muloco:overlap=2", 22), ("dasgd", 9), ("local", 8),
                                              ("streaming-diloco", 101), ("sync", 7), ("dasgd", 497), ("dasgd", 501),
                                              ("dasgd:delay=4", 500)])
def test_a_run_that_ends_on_a_round_has_no_note(algorithm, steps, tmp_path):
    """Staggered fragments (streaming-diloco) change θ piecemeal: no --steps ends on every fragment's round.
    With a delay, a run that ends at a merge leaves out only the steps computed while it travelled."""
    cfg = RunConfig(out=str(tmp_path / "run"), algorithm=algorithm, workers=2, steps=steps)
    assert check_combination(cfg).notes == ()


@pytest.mark.parametrize("algorithm", ["diloco", "local", "muloco", "sparseloco", "easgd", "streaming-diloco"])
def test_a_run_on_the_defaults_has_no_note(algorithm, tmp_path):
    """The defaults end on a round (DaSGD's do not: its 500 steps leave out the averaging of step 500, noted
    above)."""
    assert RunConfig().steps == 500
    assert check_combination(RunConfig(out=str(tmp_path / "run"), algorithm=algorithm)).notes == ()


def test_resolved_takes_the_defaults_from_the_class_and_keeps_what_was_given():
    from gradwire.algorithms.sync import SyncSGD

    filled = resolved(RunConfig(algorithm="sync:backups=1", task="digits-mlp"))  # a task of lr scale 1
    assert (filled.lr, filled.momentum) == (SyncSGD.default_lr, SyncSGD.default_momentum)
    assert filled.lr_schedule == SyncSGD.default_lr_schedule
    given = RunConfig(lr=0.3, momentum=0.5, lr_schedule="cosine")
    assert resolved(given) == given
    assert resolved(RunConfig(lr=0.3, momentum=0.5)) == RunConfig(lr=0.3, momentum=0.5, lr_schedule="constant")
    assert resolved(RunConfig(optimizer="adamw")).momentum == 0.0


def test_launch_asks_before_it_starts_a_process(tmp_path):
    """gradwire launch refuses a combination in the launcher, once, not in each of the processes."""
    from gradwire.cli import build_parser
    from gradwire.cli.launch import torchrun_argv

    ns = build_parser().parse_args(["launch", "--nproc-per-node", "4", "--", "run", "--task", LM, "--tensor-parallel",
                            "1d:p=2", "--algorithm", "async", "--out", str(tmp_path / "run")])
    with pytest.raises(ConfigError, match=r"algorithm 'async' has a server; .* \(--tensor-parallel\)$"):
        torchrun_argv(ns)


@pytest.mark.parametrize("nnodes", ["0", "-1", "1:0", "a", "2:3:4", "0:2"])
def test_launch_names_a_bad_node_count(nnodes, tmp_path):
    """--nnodes 0 was reported as a server taking the only process, for an algorithm without one."""
    from gradwire.cli import build_parser
    from gradwire.cli.launch import torchrun_argv

    ns = build_parser().parse_args(["launch", "--nproc-per-node", "2", "--nnodes", nnodes, "--", "run", "--out",
                                    str(tmp_path / "run")])
    with pytest.raises(ConfigError, match=re.escape(f"--nnodes {nnodes!r} must be a number of nodes >= 1, or a "
                                                    "range MIN:MAX with 1 <= MIN <= MAX")):
        torchrun_argv(ns)


def test_launch_checks_the_task_with_the_workers_it_counts(tmp_path):
    """A task's samples per worker are checked against the workers launch will start, not the
    default 8 (2 processes: 2 workers for 3 samples; 4 processes: 4 workers, refused)."""
    from gradwire.cli import build_parser
    from gradwire.cli.launch import torchrun_argv

    def argv(nproc: str) -> list[str]:
        return torchrun_argv(build_parser().parse_args(["launch", "--nproc-per-node", nproc, "--", "run", "--task",
                                                        "synthetic-logreg:samples=3", "--out", str(tmp_path / "r")]))

    assert argv("2")[-4:] == ["--workers", "2", "--backend", "torch"]
    with pytest.raises(ConfigError, match=r"samples=3 < 4 workers"):
        argv("4")
