"""Bad values reach the user as exactly one line ``gradwire run: error: ...`` naming the value, and
exit code 2, before anything trains; nothing is silently accepted or changed."""

import re
from pathlib import Path

import pytest

from gradwire.cli import main
from gradwire.config import RunConfig, check_out_folder
from gradwire.errors import ConfigError
from gradwire.run.combination import check_combination
from gradwire.spec import parse_spec
from tests.helpers import gw

COMMON = ["--task", "digits-logreg", "--workers", "4", "--steps", "2", "--eval-every", "2"]


def one_error_line(capsys, argv, tmp_path, data_dir) -> str:
    """Run ``gradwire run ARGV`` in this process; assert exit 2 and one error line; return it."""
    if "--out" not in argv:
        argv = [*argv, "--out", str(tmp_path / "o")]
    code = main(["run", *COMMON, *argv, "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradwire run: error: "), err
    return lines[0]


@pytest.mark.parametrize("args, needles", [
    # step sizes: finite, > 0, and representable in the training dtype
    (["--lr", "1e308"], ["lr=1e+308", "too large for dtype float32", "--lr"]),
    (["--lr", "inf"], ["lr=inf", "finite number > 0"]),
    (["--lr", "nan"], ["lr=nan", "finite number > 0"]),
    (["--lr", "-0.1"], ["lr=-0.1", "finite number > 0"]),
    # a rate that is 0 in the training dtype trains nothing (it ran, exit 0)
    (["--lr", "1e-46"], ["lr=1e-46 rounds to 0 in dtype float32", "--dtype float64", "(--lr)"]),
    (["--weight-decay", "nan"], ["weight_decay=nan", "finite number >= 0"]),
    (["--weight-decay", "1e39"], ["weight_decay=1e+39", "too large for dtype float32"]),
    # the seed: blamed on itself, not on the partition
    (["--seed", "-1"], ["seed=-1", "[0, 2**63)", "--seed"]),
    (["--seed", str(2**63)], [f"seed={2**63}", "--seed"]),
    # spec strings with an empty tail
    (["--algorithm", "sync:"], ["'sync:' has nothing after ':'", "'sync:key=value,...'"]),
    (["--compressor", "qsgd:"], ["'qsgd:' has nothing after ':'", "'qsgd:key=value,...'"]),
    (["--compressor", "qsgd: "], ["'qsgd: ' has nothing after ':'"]),
    (["--compressor", "qsgd:levels=4,"], ["'qsgd:levels=4,' has an empty item", "qsgd:key=value"]),
    (["--stragglers", "tail:p=0.1,,slowdown=2"], ["'tail:p=0.1,,slowdown=2' has an empty item"]),
    # error feedback with nothing to feed back
    (["--error-feedback"], ["--error-feedback needs --compressor", "'sync'"]),
    (["--error-feedback", "--algorithm", "sync:backups=1"], ["--error-feedback needs --compressor"]),
    (["--error-feedback", "--algorithm", "async"], ["--error-feedback needs --compressor", "'async'"]),
    # a batch larger than a worker's shard (digits-logreg on 4 workers: 359 or 360 samples each)
    (["--batch-size", "100000"], ["batch_size=100000", "shard", "--batch-size full"]),
    (["--batch-size", "360"], ["batch_size=360", "359 samples"]),
    # every wait needs a finite limit (Condition.wait_for and timedelta overflow on inf)
    (["--timeout-s", "inf"], ["timeout_s=inf", "> 0 and finite", "--timeout-s"]),
    (["--timeout-s", "1e10"], ["timeout_s=10000000000.0", "at most", "--timeout-s"]),  # past threading.TIMEOUT_MAX
    # a network's range is checked before the run folder is claimed, with its flag
    (["--network", "ring:mbps=-1"], ["mbps must be > 0, got -1.0", "--network"]),
    (["--network", "halving-doubling:latency_ms=-2"], ["latency_ms must be >= 0", "--network"]),
    (["--partition", "dirichlet:alpha=-1"], ["alpha must be > 0, got -1.0", "--partition"]),
    (["--partition", "volumes:skew=0.5"], ["skew must be >= 1", "--partition"]),
    # a fault-tolerance spec: one line, before the replica announces itself
    (["--fault-tolerance", "nosuch", "--backend", "torch"], ["fault_tolerance='nosuch'", "valid choices are none"]),
])
def test_bad_value_is_one_line(capsys, tmp_path, data_dir, args, needles):
    line = one_error_line(capsys, args, tmp_path, data_dir)
    for needle in needles:
        assert needle in line


@pytest.mark.parametrize("task, needle", [
    ("synthetic-logreg:dim=0", "dim must be >= 1, got 0"),
    ("synthetic-logreg:samples=3", "samples=3 < 4 workers"),
    ("stdlib-lm:dim=10,heads=3", "dim must be a positive multiple of heads=3, got dim=10"),
])
def test_bad_task_parameter_is_one_line_before_the_folder_is_claimed(capsys, tmp_path, data_dir, task, needle):
    """A task's parameter ranges are checked without loading its data, before the run claims --out:
    a typo leaves no empty folder (nor a lock file) behind."""
    out = tmp_path / "run"
    line = one_error_line(capsys, ["--task", task, "--out", str(out)], tmp_path, data_dir)
    assert needle in line and line.endswith("(--task)"), line
    assert not out.exists()


# (sync:backups=4 on 4 workers was refused here too; check_combination now refuses it before the claim:
# tests/cli/test_prerun_checks.py)
@pytest.mark.parametrize("args, needle", [
    (["--algorithm", "async", "--compressor", "powersgd:rank=4"], "averages gradients by allreduce itself"),
    (["--partition", "dirichlet:alpha=0.5", "--workers", "400"], "would get no data"),
])
def test_a_run_refused_after_its_claim_leaves_no_folder(capsys, tmp_path, data_dir, args, needle):
    """Some combinations are refused only once the run is built (after it claimed --out): the folder
    it made, holding nothing but its lock, goes with it; a folder that was there before stays."""
    out = tmp_path / "new" / "run"
    line = one_error_line(capsys, [*args, "--out", str(out)], tmp_path, data_dir)
    assert needle in line and re.search(r"\(--[\w-]+\)$", line), line  # named, with its flag, as every message
    assert not out.exists() and (tmp_path / "new").is_dir()
    kept = tmp_path / "mine"
    kept.mkdir()
    one_error_line(capsys, [*args, "--out", str(kept)], tmp_path, data_dir)
    assert kept.is_dir()


def test_out_naming_a_file(capsys, tmp_path, data_dir):
    (tmp_path / "f").write_text("not a folder")
    line = one_error_line(capsys, ["--out", str(tmp_path / "f")], tmp_path, data_dir)
    assert f"out='{tmp_path / 'f'}' is an existing file, not a folder" in line
    assert (tmp_path / "f").read_text() == "not a folder"


def test_out_under_a_file(capsys, tmp_path, data_dir):
    (tmp_path / "f").write_text("")
    line = one_error_line(capsys, ["--out", str(tmp_path / "f" / "a" / "run")], tmp_path, data_dir)
    assert f"out='{tmp_path / 'f' / 'a' / 'run'}' cannot be created: '{tmp_path / 'f'}' is a file" in line


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_out_where_no_folder_can_be_made(capsys, tmp_path, data_dir):
    line = one_error_line(capsys, ["--out", "/proc/gradwire-run"], tmp_path, data_dir)
    assert "out='/proc/gradwire-run' cannot be used: cannot create folders in '/proc'" in line


def test_out_check_leaves_nothing_behind(tmp_path):
    check_out_folder(str(tmp_path / "a" / "b"))  # creatable: fine, and nothing is created
    check_out_folder(str(tmp_path))              # an existing folder: fine
    assert list(tmp_path.iterdir()) == []


def test_valid_neighbours_still_pass(tmp_path, data_dir):
    """The rules reject only what they name: the largest representable step sizes, the largest
    seed, error feedback with a compressor or with an algorithm that compresses by itself."""
    base = dict(task="digits-logreg", out=str(tmp_path / "o"), data_dir=str(data_dir))
    for kw in (dict(lr=1e38), dict(lr=1e300, dtype="float64"), dict(weight_decay=0.0), dict(seed=2**63 - 1),
               dict(error_feedback=True, compressor="topk:ratio=0.1"), dict(error_feedback=True, algorithm="dqgd"),
               dict(error_feedback=True, algorithm="dagc"), dict(algorithm="sync:backups=1")):
        check_combination(RunConfig(**base, **kw))


@pytest.mark.parametrize("bad", ["sync:", "sync: ", "qsgd:levels=4,", "qsgd:,levels=4", "qsgd:levels=4,,bucket=8"])
def test_parse_spec_rejects_empty_tails(bad):
    with pytest.raises(ConfigError, match="has nothing after ':'|has an empty item"):
        parse_spec(bad)


def test_one_line_in_a_real_process(tmp_path, data_dir):
    """The same through ``python -m gradwire``: exit 2, one line, no traceback."""
    p = gw("run", *COMMON, "--lr", "1e308", "--out", str(tmp_path / "o"), "--data-dir", str(data_dir))
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("gradwire run: error: lr=1e+308") and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flag, spec", [("--network", "ring:mbps=0"), ("--partition", "dirichlet:alpha=0")])
def test_a_network_or_partition_out_of_range_claims_no_folder(capsys, tmp_path, data_dir, flag, spec):
    one_error_line(capsys, [flag, spec, "--out", str(tmp_path / "never")], tmp_path, data_dir)
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("command, flag", [("compare", "--variant"), ("plan", "--candidate")])
def test_a_stray_quote_in_a_variant_or_candidate_is_one_line(capsys, tmp_path, command, flag):
    code = main([command, flag, '--name "a', "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"""{flag} '--name "a': No closing quotation""" in err[0]


@pytest.mark.parametrize("content, needle", [
    (b"variants: 5\n", "'variants' in"),
    (b"lr: 0.1\n\xff\xfe\n", "cannot read config file"),
])
def test_a_compare_config_file_that_cannot_be_used_is_one_line(capsys, tmp_path, content, needle):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    code = main(["compare", "--config", str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err


def test_a_config_path_naming_a_folder_says_so(capsys, tmp_path, data_dir):
    line = one_error_line(capsys, ["--config", str(tmp_path)], tmp_path, data_dir)
    assert "does not exist or is not a file" in line


def test_runs_and_comparisons_keep_to_their_own_folders(capsys, tmp_path, data_dir):
    """A run refuses a comparison's folder and a comparison a run's, even with --overwrite (which
    replaces only its own kind); a comparison's config file given to `gradwire run` is one run of its
    common keys, and the command says so."""
    small = ["--task", "digits-logreg", "--workers", "2", "--steps", "2", "--eval-every", "2",
             "--data-dir", str(data_dir)]
    cmp_dir, run_dir = tmp_path / "cmp", tmp_path / "one"
    assert main(["compare", *small, "--out", str(cmp_dir), "--variant", "--algorithm sync"]) == 0
    assert main(["run", *small, "--out", str(run_dir)]) == 0
    capsys.readouterr()
    before = sorted(p.name for p in cmp_dir.iterdir())
    for extra in ([], ["--overwrite"]):
        assert main(["run", *small, "--out", str(cmp_dir), *extra]) == 2
        assert capsys.readouterr().err.strip() == (f"gradwire run: error: run folder {cmp_dir} holds a comparison "
                                                   "(comparison.md): a run needs a folder of its own; choose another "
                                                   "--out")
        assert main(["compare", *small, "--out", str(run_dir), "--variant", "--algorithm sync", *extra]) == 2
        assert capsys.readouterr().err.strip() == (f"gradwire compare: error: compare folder {run_dir} holds a run "
                                                   "(summary.json): a comparison needs a folder of its own, its runs "
                                                   "in subfolders; choose another --out")
    assert sorted(p.name for p in cmp_dir.iterdir()) == before and not (run_dir / "sync").exists()
    config = tmp_path / "cmp.yaml"
    config.write_text("task: digits-logreg\nworkers: 2\nvariants:\n  - {algorithm: sync}\n  - {algorithm: local}\n")
    assert main(["run", "--config", str(config), *small, "--out", str(tmp_path / "from-file")]) == 0
    assert (f"gradwire run: {config} lists 2 variants, which `gradwire compare` runs; this is one run of the file's "
            "common keys") in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_a_data_dir_that_cannot_be_made_is_one_line(capsys, tmp_path):
    """Checked where a task first writes its cache (a task without one never needs the folder: a run
    of synthetic-logreg from a read-only directory must work); the run's folder goes again."""
    out = tmp_path / "run"
    assert main(["run", *COMMON, "--out", str(out), "--data-dir", "/proc/gradwire-data"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gradwire run: error: data_dir='/proc/gradwire-data' cannot be used: cannot create it (No such "
                   "file or directory) (--data-dir)"]
    assert not out.exists()
    assert main(["run", "--task", "synthetic-logreg", "--workers", "2", "--steps", "2", "--eval-every", "2",
                 "--out", str(out), "--data-dir", "/proc/gradwire-data"]) == 0


def test_report_out_must_name_a_file_in_a_folder(capsys, tmp_path, data_dir):
    run_dir = tmp_path / "one"
    assert main(["run", *COMMON, "--out", str(run_dir), "--data-dir", str(data_dir)]) == 0
    (tmp_path / "afile").write_text("")
    capsys.readouterr()
    for out, message in [(run_dir, f"--out {str(run_dir)!r} is a folder; name the page's file, e.g. "
                                   f"{str(run_dir / 'report.html')!r}"),
                         (tmp_path / "afile" / "x.html", f"--out {str(tmp_path / 'afile' / 'x.html')!r}: "
                                                          f"{str(tmp_path / 'afile')!r} is a file, not a folder")]:
        assert main(["report", str(run_dir), "--out", str(out)]) == 2
        assert capsys.readouterr().err.strip() == f"gradwire report: error: {message}"
    assert not list(tmp_path.glob("*.tmp")) and not list(run_dir.glob("*.tmp"))
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "pg" / "x.html")]) == 2
    assert not (tmp_path / "pg").exists()  # a refused report makes no folder
    page = tmp_path / "pages" / "deep" / "one.html"  # a folder that can be made is made
    assert main(["report", str(run_dir), "--out", str(page)]) == 0 and page.stat().st_size > 0


@pytest.mark.parametrize("variant, flag", [("--out foo", "--out"), ("--algorithm sync --overwrite", "--overwrite"),
                                           ("--algorithm sync --resume-or-start", "--resume-or-start")])
def test_a_variant_cannot_set_what_the_comparison_sets(capsys, tmp_path, data_dir, variant, flag):
    """It was ignored without a word (every variant writes OUT/<its name>)."""
    out = tmp_path / "cmp"
    assert main(["compare", *COMMON, "--data-dir", str(data_dir), "--out", str(out), "--variant", variant]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gradwire compare: error: --variant {variant!r} sets {flag}, which the comparison sets for every variant "
        "(each runs in OUT/<its name>; --name names it): give it to compare itself, not to one variant")
    assert not out.exists()


@pytest.mark.parametrize("variants", [[""], ["   "], ["--name a --algorithm local", ""]])
def test_an_empty_variant_is_refused_in_one_line(capsys, tmp_path, data_dir, variants):
    """It ran the common flags as one more variant without a word (``--variant ''``), as plan's --candidate ''
    is refused."""
    out = tmp_path / "cmp"
    given = [w for v in variants for w in ("--variant", v)]
    assert main(["compare", *COMMON, "--data-dir", str(data_dir), "--out", str(out), *given]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gradwire compare: error: --variant {variants[-1]!r} gives no run flags; give the flags that make the variant "
        "differ from the common ones, e.g. --variant \"--algorithm sync:backups=2\"")
    assert not out.exists()


def test_a_variant_cannot_set_them_through_a_file_either(capsys, tmp_path, data_dir):
    """Nor through its own --config file, nor with the file's hyphenated spelling of the key."""
    own = tmp_path / "v.yaml"
    own.write_text("overwrite: true\n")
    assert main(["compare", *COMMON, "--data-dir", str(data_dir), "--out", str(tmp_path / "a"),
                 "--variant", f"--config {own} --name a"]) == 2
    assert f"--variant '--config {own} --name a''s {own} sets --overwrite" in capsys.readouterr().err
    spelled = tmp_path / "cmp.yaml"
    spelled.write_text("task: digits-logreg\nvariants:\n  - {name: a, resume-or-start: true}\n")
    assert main(["compare", "--config", str(spelled), "--steps", "2", "--data-dir", str(data_dir),
                 "--out", str(tmp_path / "b")]) == 2
    assert f"a variant in {spelled} sets --resume-or-start" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_compare_resume_to_more_steps_stops_before_any_variant_runs(capsys, tmp_path, data_dir):
    """A variant that finished without a checkpoint cannot go on to more --steps: said before the
    first variant runs (it was said by the variant halfway through, naming a flag never typed)."""
    out = tmp_path / "cmp"
    base = ["compare", "--task", "digits-logreg", "--workers", "2", "--eval-every", "2", "--data-dir", str(data_dir),
            "--out", str(out), "--variant", "--algorithm sync", "--variant", "--algorithm local"]
    assert main([*base, "--steps", "4"]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".gradwire.lock"}
    capsys.readouterr()
    assert main([*base, "--steps", "8", "--resume"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (f"gradwire compare: error: resume=true: variant 'sync' finished at step 4 in "
                                    f"{out / 'sync'} and saved no checkpoint, so it cannot go on to --steps 8; run the "
                                    "comparison again with --overwrite, or choose another --out (--resume)")
    assert "[1/2]" not in captured.out
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".gradwire.lock"} == before


def test_a_variant_named_checkpoint_does_not_make_its_comparison_a_run(tmp_path, data_dir):
    out = tmp_path / "cmp"
    base = ["compare", *COMMON, "--data-dir", str(data_dir), "--out", str(out), "--variant",
            "--algorithm sync --name checkpoint", "--checkpoint-every", "2"]
    assert main(base) == 0 and (out / "checkpoint" / "summary.json").exists()
    assert main([*base, "--resume"]) == 0


def test_the_torch_backend_outside_torchrun_is_bad_input(capsys, tmp_path, data_dir, monkeypatch):
    """--backend torch started by hand (no torchrun environment): exit 2 with the way to start it, no
    folder (it was reported as a communication error, exit 4)."""
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    line = one_error_line(capsys, ["--backend", "torch", "--workers", "1"], tmp_path, data_dir)
    assert "needs torchrun's environment" in line and "gradwire launch" in line and line.endswith("(--backend)")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kw,message", [
    (dict(steps="10"), "steps='10' is not a valid integer (--steps)"),
    (dict(error_feedback="yes"), "error_feedback='yes' is not a valid bool (--error-feedback)"),
    (dict(lr="0.1"), "lr='0.1' is not a valid number (--lr)"),
    (dict(workers=True), "workers=True is not a valid integer (--workers)"),
])
def test_a_run_config_made_in_python_refuses_a_value_of_another_type(kw, message):
    """The command line and config files convert values; a RunConfig made in Python is checked for
    its types (steps="10" was a TypeError deep in a comparison, error_feedback="yes" a silent True)."""
    from gradwire.config import RunConfig
    from gradwire.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        RunConfig(**kw).validate()
    assert str(e.value) == message
    RunConfig(steps=10, lr=0.1, batch_size="full", workers=4).check_values()  # the right types pass
    import numpy as np

    RunConfig(steps=np.int64(10), lr=np.float32(0.1), error_feedback=np.True_, timeout_s=30).check_values()
