"""Bad parameters of the local-update algorithms (LSGD, EASGD, local SGD, DaSGD) are one clear line,
naming the value and the rule."""

import json

import pytest

from gradwire.cli import main
from tests.helpers import gw


@pytest.mark.parametrize("spec, needle", [
    ("lsgd:groups=3", "groups=3 does not divide the 8 workers into equal groups (choose a divisor of 8)"),
    ("lsgd:groups=16", "groups=16 does not divide the 8 workers"),
    ("lsgd:groups=-1", "groups must be >= 1, or 0 for one group per node; got -1"),
    ("lsgd:period=0", "period must be >= 1 (local steps between communications), got 0"),
    ("lsgd:groups=2,global_period=-3", "global_period must be >= 1"),
    ("lsgd:pull=1.5", "pull must be in [0, 1] (the fraction of the way to the leader), got 1.5"),
    ("lsgd:pull=-0.1", "pull must be in [0, 1]"),
    ("lsgd:global_pull=2", "global_pull must be in [0, 1]"),
    ("lsgd:async=maybe", "algorithm 'lsgd': async='maybe' is not a valid bool"),
    ("lsgd:prox=5", "prox must be in [0, period=4] (each step pulls prox/period of the way to the leader's "
                    "snapshot), got 5"),
    ("lsgd:groups=2,global_prox=-1", "global_prox must be in [0, global_period=16]"),
    ("lsgd:window=-2", "window must be >= 1 (minibatch losses in the running mean), or 0 for the authors' "
                       "period/4; got -2"),
    ("lsgd:eval=center", "eval='center': valid choices are average, leader, each"),
    ("lsgd:async=true,eval=average", "eval=average does not apply with async=true: the server holds only the "
                                     "leader's parameters (valid choice: leader)"),
    ("easgd:eval=leader", "eval='leader': valid choices are center, average, each"),
    ("easgd:async=true,eval=each", "eval=each does not apply with async=true"),
    ("local:eval=center", "eval='center': valid choices are last_average, average, each"),
    ("lsgd:asynch=true", "algorithm 'lsgd' has no parameter 'asynch'; valid parameters: pull, period"),
    ("easgd:alpha=1.5", "alpha must be in [0, 1] (0 = beta / workers), got 1.5"),
    ("easgd:beta=-1", "beta must be in [0, 1], got -1"),
    ("easgd:period=0", "period must be >= 1"),
    ("local:period=0", "period must be >= 1 (local steps between averagings), got 0"),
    ("dasgd:period=0", "period must be >= 1"),
    ("dasgd:period=4,delay=5", "delay must be in [0, period=4] (at most one average in flight), got 5"),
    ("dasgd:delay=-1", "delay must be in [0, period=4]"),
])
def test_bad_parameters_are_one_clear_line(tmp_path, data_dir, capsys, spec, needle):
    code = main(["run", "--algorithm", spec, "--workers", "8", "--steps", "1", "--task", "digits-logreg",
                 "--out", str(tmp_path / "o"), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_compressor_does_not_apply_to_parameter_exchange(tmp_path, data_dir):
    p = gw("run", "--algorithm", "easgd", "--compressor", "qsgd", "--task", "digits-logreg", "--steps", "2",
           "--out", str(tmp_path / "o"), "--data-dir", str(data_dir))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "easgd exchanges parameters uncompressed: --compressor and --error-feedback do not apply" in p.stderr


def test_nesterov_needs_momentum(tmp_path, data_dir, capsys):
    code = main(["run", "--nesterov", "--steps", "1", "--task", "digits-logreg", "--out", str(tmp_path / "o"),
                 "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and "nesterov=true needs momentum > 0" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("algorithm", ["diana", "signsgd"])
def test_nesterov_is_refused_where_the_algorithm_has_its_own_momentum(tmp_path, data_dir, capsys, algorithm):
    code = main(["run", "--algorithm", algorithm, "--momentum", "0.9", "--nesterov", "--steps", "1", "--task",
                 "digits-logreg", "--out", str(tmp_path / "o"), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and "--nesterov does not apply" in err and len(err.strip().splitlines()) == 1, err


def test_signsgd_refuses_a_momentum_flag_it_would_ignore(tmp_path, data_dir, capsys):
    """Signum's β is the spec's (signsgd:momentum=β); --momentum would be recorded and not used."""
    code = main(["run", "--algorithm", "signsgd", "--momentum", "0.5", "--steps", "1", "--task", "digits-logreg",
                 "--out", str(tmp_path / "o"), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and "signsgd:momentum=β, 0.8 here): --momentum 0.5 does not apply" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags, says", [
    (["--algorithm", "diloco"], "nesterov=true: --nesterov does not apply to algorithm 'diloco'"),
    (["--algorithm", "diloco", "--momentum", "0.9"], "nesterov=true: --nesterov does not apply to algorithm 'diloco'"),
    (["--algorithm", "diloco", "--momentum", "0"], "nesterov=true: --nesterov does not apply to algorithm 'diloco'"),
    (["--algorithm", "muloco"], "nesterov=true: --nesterov does not apply to algorithm 'muloco'"),
    (["--algorithm", "demo"], "nesterov=true: --nesterov does not apply to algorithm 'demo'"),
    (["--algorithm", "diana"], "nesterov=true: --nesterov does not apply to algorithm 'diana'"),
    (["--optimizer", "adamw"], "nesterov=true applies to --optimizer sgd's momentum; --optimizer 'adamw' keeps its "
                               "own moments"),
    (["--optimizer", "adamw", "--momentum", "0.9"], "--optimizer 'adamw' keeps its own moments"),
    (["--optimizer", "muon"], "--optimizer 'muon' keeps its own moments (Muon's Nesterov form is its spec's: "
                              "muon:nesterov=true, the default)"),
])
def test_nesterov_where_it_does_not_apply_says_so_and_asks_for_no_momentum(tmp_path, data_dir, capsys, flags, says):
    """It said "needs momentum > 0 (--momentum 0.9 --nesterov)", and with that momentum, that --momentum
    does not apply: a loop. Now one line, once, with or without --momentum."""
    code = main(["run", *flags, "--nesterov", "--workers", "2", "--steps", "20", "--task", "digits-logreg",
                 "--out", str(tmp_path / "o"), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "needs momentum" not in err and err.strip().endswith("(--nesterov)"), err
    assert not (tmp_path / "o").exists()


def test_the_steps_that_never_reach_the_evaluated_model_are_noted_on_stderr(tmp_path, data_dir, capsys):
    """DiLoCo with H = 2 and --steps 3: the step after the last round is computed and thrown away."""
    code = main(["run", "--algorithm", "diloco:inner_steps=2", "--workers", "2", "--steps", "3", "--task",
                 "digits-logreg", "--out", str(tmp_path / "o"), "--data-dir", str(data_dir), "--no-curves"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert ("gradwire run: note: the last outer round of algorithm 'diloco:inner_steps=2' is incomplete: its 1 step "
            "after step 2 will not reach the evaluated model") in err, err


def test_too_few_steps_for_one_round_are_refused_before_the_run(tmp_path, data_dir, capsys):
    code = main(["run", "--algorithm", "muloco", "--workers", "4", "--steps", "12", "--eval-every", "6", "--task",
                 "digits-logreg", "--out", str(tmp_path / "o"), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "steps=12 < inner_steps=20: no outer round of algorithm 'muloco' would complete" in err, err
    assert not (tmp_path / "o").exists()


def test_a_dasgd_run_on_its_defaults_notes_the_steps_its_last_averaging_leaves_out(tmp_path, data_dir, capsys):
    """500 steps, τ = 4, d = 1: the averaging that starts at step 500 is never merged, so the model
    evaluated holds step 496's work; the note says so and names the --steps that end on a merge (a review
    found it suppressed for a while, on the run that leaves out the most)."""
    code = main(["run", "--algorithm", "dasgd", "--workers", "2", "--task", "digits-logreg", "--out",
                 str(tmp_path / "o"), "--data-dir", str(data_dir), "--no-curves"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert ("the last averaging of algorithm 'dasgd' is incomplete: its 4 steps after step 496 will not reach the "
            "evaluated model") in err and "--steps 497 or 501 ends on one" in err, err
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["steps"] == 500


def test_a_dasgd_run_that_ends_mid_round_is_noted(tmp_path, data_dir, capsys):
    code = main(["run", "--algorithm", "dasgd", "--workers", "2", "--steps", "11", "--task", "digits-logreg",
                 "--out", str(tmp_path / "o"), "--data-dir", str(data_dir), "--no-curves"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert ("gradwire run: note: the last averaging of algorithm 'dasgd' is incomplete: its 3 steps after step 8 will "
            "not reach the evaluated model, which changes only at averagings (this run's last after step 9); --steps 9 "
            "or 13 ends on one (the 1 step computed while it travels stays outside it, as at the end of every "
            "overlapped run)") in err, err
