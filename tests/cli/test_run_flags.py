"""The run flags are declared once (gradwire/cli/flags.py): the commands and the benchmarks take
them from there, typed and checked as ``gradwire run`` checks them."""

import argparse
import ast
from pathlib import Path

import pytest

from gradwire.cli.flags import SWEEP_FLAGS, add_run_flags, flag_of, parse_run_args
from gradwire.config import KEYS

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RUN_FLAGS = {flag_of(k) for k in KEYS} | set(SWEEP_FLAGS.values())

# Flags of a run key's name that mean something else in that benchmark, so are not the run's flag
# (each entry must still be declared there: the list stays true).
OWN_MEANING = {
    ("ddp_hook.py", "--dtype"): "the model's dtype, bfloat16 and float16 included (a run's is float32 | float64)",
    ("gpu_codecs.py", "--dtype"): "the codecs' input dtype, bfloat16 and float16 included",
    ("gpu_codecs.py", "--kernels"): "the kernel sets to compare, comma-separated (default: every one that runs)",
    ("network_model_check.py", "--timeout-s"): "a whole test-bed case's wall-clock limit, not a wait on a peer",
    ("testbed_time_to_accuracy.py", "--timeout-s"): "a whole testbed run's wall-clock limit, not a wait on a peer",
    ("time_to_accuracy.py", "--timeout-s"): "a whole testbed run's wall-clock limit, not a wait on a peer",
}


def declared_flags(source: str) -> set[str]:
    """The long options a script declares with ``add_argument("--x", ...)`` on any parser."""
    return {node.args[0].value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument" and node.args and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("--")}


def test_no_benchmark_redeclares_a_run_flag():
    redeclared = {(p.name, flag) for p in sorted(BENCHMARKS.glob("*.py"))
                  for flag in declared_flags(p.read_text()) & RUN_FLAGS}
    assert redeclared - set(OWN_MEANING) == set(), "take these from gradwire.cli.flags.add_run_flags"
    assert set(OWN_MEANING) - redeclared == set(), "no longer declared: delete from OWN_MEANING"


def test_the_walk_finds_a_declaration():
    """The walker itself (a test that cannot fail is a defect)."""
    source = 'import argparse\np = argparse.ArgumentParser()\np.add_argument("--steps", type=int)\n' \
             'sub = p.add_subparsers().add_parser("x")\nsub.add_argument("--seeds", "-s")\nsub.add_argument("n")\n'
    assert declared_flags(source) == {"--steps", "--seeds"}


def benchmark_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench", exit_on_error=False)
    add_run_flags(parser, only=("steps", "workers", "seed", "lr", "error_feedback", "task"),
                  defaults={"steps": 40, "workers": [8, 64], "seed": [0]}, sweep=("workers", "seed"))
    parser.add_argument("--repeats", type=int, default=3)  # a benchmark's own flag beside them
    return parser


def test_a_benchmarks_run_flags_are_typed_with_its_defaults():
    ns, cfg = parse_run_args(benchmark_parser(), ["--steps", "7", "--workers", "2", "4,8", "--seeds", "1,2"])
    assert (ns.steps, ns.workers, ns.seeds, ns.repeats) == (7, [2, 4, 8], [1, 2], 3)
    assert ns.lr is None and ns.error_feedback is False and ns.task == "mnist1d-mlp"  # the run config's defaults
    assert (cfg.steps, cfg.lr, cfg.task) == (7, None, "mnist1d-mlp")
    ns, _ = parse_run_args(benchmark_parser(), ["--lr", "0.5", "--error-feedback"])
    assert (ns.steps, ns.workers, ns.seeds, ns.lr, ns.error_feedback) == (40, [8, 64], [0], 0.5, True)


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "bench: error: steps=0 must be a positive integer (--steps)"),
    (["--steps", "many"], "bench: error: steps='many' is not a valid int (--steps)"),
    (["--workers", "2,x"], "bench: error: --workers: workers='x' is not a valid int (--workers)"),
])
def test_a_bad_run_flag_in_a_benchmark_is_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_run_args(benchmark_parser(), argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == message


def test_a_key_that_is_no_run_key_is_refused_at_once():
    with pytest.raises(ValueError, match="not run config keys: \\['step'\\]"):
        add_run_flags(argparse.ArgumentParser(), only=("step",))


def test_the_supervisor_starts_without_the_commands():
    """``python -m gradwire.cli.supervise`` runs the package's __init__ first: it and the
    supervisor import only the standard library at module level (the commands load on demand)."""
    package = Path(__file__).resolve().parents[2] / "src" / "gradwire" / "cli"
    for name in ("__init__.py", "supervise.py"):
        tree = ast.parse((package / name).read_text())
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        modules = [n.module if isinstance(n, ast.ImportFrom) else a.name for n in top
                   for a in (n.names if isinstance(n, ast.Import) else [n])]
        assert [m for m in modules if m and m.split(".")[0] == "gradwire"] == [], name


def test_the_steps_help_says_what_a_step_is_and_which_algorithms_count_rounds(capsys):
    """It said "algorithm steps (aggregation rounds)"; in the DiLoCo family a step is one inner step,
    and only the server-mode DiLoCo family (and dagc's local_steps) count rounds, which their own
    help in `gradwire list` says too."""
    from gradwire.cli import main
    from gradwire.cli.flags import field_help

    steps = field_help()["steps"]
    assert "aggregation rounds" not in steps and "inner, local step" in steps, steps
    assert "one outer round each for backup-diloco and async-diloco" in steps, steps
    assert field_help()["lr_schedule"] == "lr over the run: constant, cosine or linear:warmup=W,min_ratio=R"
    assert main(["list", "algorithms"]) == 0
    listing = capsys.readouterr().out
    for name in ("backup-diloco", "async-diloco"):
        line = next(x for x in listing.splitlines() if x.startswith(f"  {name} "))
        assert "a --steps step is" in line and "outer round" in line, line
