"""Every example that README.md and the --help pages show runs: each `gradwire run` line of
gradwire run's epilog and of the README's "Command line" block, shortened to a few steps, exits 0 with a
finite loss; the README's walk-through (`make demo`, then every line of its "Command line" block
in order, in one folder) and every example of the run, compare, plan and reproduce --help pages
exit 0 on small settings; the README's compressor snippet runs as written. (The README's DDP
snippet is run on 2 gloo processes in tests/ddp/test_readme_snippet.py.)

Small settings: a few steps (enough for a warm-up the line asks for), 4 workers for a
comparison, a target every short run reaches for a plan, and `reproduce --quick` on its quickest
claim (every claim's --quick runs in tests/reproduce/test_every_claim.py). A config file an
example names but the repository does not hold (the user's own run.yaml, base.yaml) is written
small first. Not run here: the torchrun/launch lines of the README (tests/backends/test_readme_launch.py runs
each, shortened, the two-node lines as two launchers on this machine) and of `launch --help`
(tests/backends/ launch such groups).
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest

from gradwire.algorithms import ALGORITHMS
from gradwire.cli import main
from gradwire.cli.run import EPILOG as EPILOG_RUN

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
# the example that diverged (NaN at step 76 with qsgd:levels=4 and error feedback) runs past that
EF_STEPS = 150


def _help_examples() -> list[str]:
    """`gradwire run ...` lines of EPILOG_RUN, without their trailing "(comment)"."""
    lines = [line.strip() for line in EPILOG_RUN.splitlines()]
    return [re.sub(r"\s{2,}\(.*\)$", "", line) for line in lines if line.startswith("gradwire run ")]


def _readme_block(heading: str, language: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    return section.split(f"```{language}\n", 1)[1].split("\n```", 1)[0]


def _readme_commands() -> list[list[str]]:
    """The commands of the README's "Command line" block (continuation lines joined, comments cut)."""
    block = _readme_block("## Command line", "bash").replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def _readme_run_examples() -> list[str]:
    return [shlex.join(cmd) for cmd in _readme_commands() if cmd[:2] == ["gradwire", "run"] and "--help" not in cmd]


EXAMPLES = [("help", e) for e in _help_examples()] + [("readme", e) for e in _readme_run_examples()]


def test_the_examples_are_found():
    assert len(_help_examples()) == 4
    assert any("--error-feedback" in e for e in _help_examples())
    assert len(_readme_run_examples()) == 5


@pytest.mark.parametrize("where,example", EXAMPLES, ids=[f"{w}{i}" for i, (w, _) in enumerate(EXAMPLES)])
def test_run_example(where, example, tmp_path, data_dir, monkeypatch):
    argv = shlex.split(example)[1:]
    if "--config" in argv:
        name = argv[argv.index("--config") + 1]
        if not (ROOT / name).exists():  # the user's own config file (run.yaml): written small, as the slow test does
            (tmp_path / name).write_text(USER_FILES[name])
            monkeypatch.chdir(tmp_path)
        else:
            argv[argv.index("--config") + 1] = str(ROOT / name)
    steps = EF_STEPS if "--error-feedback" in argv else STEPS
    out = tmp_path / "run"
    # later flags win: the shortened run replaces an example's own --steps and --out
    code = main(argv + ["--steps", str(steps), "--eval-every", str(steps // 2), "--out", str(out),
                        "--data-dir", str(data_dir)])
    assert code == 0, example
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == steps
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    final = summary["final"]["train_loss"]
    assert math.isfinite(final), (example, final)
    if "--error-feedback" in argv:
        assert final < first["train_loss"], (example, first["train_loss"], final)


def test_list_and_help(capsys):
    assert ["gradwire", "list"] in _readme_commands() and ["gradwire", "run", "--help"] in _readme_commands()
    assert main(["list"]) == 0
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    for example in _help_examples():
        assert example in shown


# -- the walk-through --------------------------------------------------------------------------------

MAKE_DEMO = "gradwire compare --config examples/demo.yaml --out runs/demo --overwrite"  # the Makefile's demo
USER_FILES = {"run.yaml": "task: digits-logreg\nworkers: 2\n",
              "base.yaml": "task: synthetic-logreg:samples=256,dim=5\nbatch_size: 8\n"}


def _makefile_demo() -> str:
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if "compare --config examples/demo.yaml" in x)
    return line.strip().removeprefix("$(VENV)/bin/")


def _epilog_commands(epilog: str, command: str) -> list[list[str]]:
    """The `gradwire COMMAND` examples of a --help epilog: continuation lines joined, a trailing
    "(comment)" cut, and "..." (the page's "the rest as above") replaced by the first example's flags."""
    text = epilog.replace("\\\n", " ")
    lines = [re.sub(r"\s{2,}\(.*\)$", "", x.strip()) for x in text.splitlines()]
    found = [shlex.split(x) for x in lines if x.startswith(f"gradwire {command} ")]
    first = found[0][2:]
    return [[*cmd[:2], *[a for part in cmd[2:] for a in (first if part == "..." else [part])]] for cmd in found]


def _small(cmd: list[str], data_dir) -> list[str]:
    """``cmd`` (without "gradwire") on small settings; later flags win."""
    argv, what = cmd[1:], cmd[1]
    if "--help" in argv or what in ("list", "report"):
        return argv
    if what == "reproduce":
        return argv if "--list" in argv else [*argv, "--quick", "--only", "lsgd-symmetry"]
    warmup = re.search(r"warmup=(\d+)", " ".join(argv))
    steps = max(4, int(warmup.group(1)) + 2) if warmup else 4
    if "--algorithm" in argv:  # enough for the first round of one whose evaluated model changes only at rounds
        rounds = ALGORITHMS.build(argv[argv.index("--algorithm") + 1]).evaluated_rounds()
        steps = max(steps, rounds.first if rounds else 1)
    small = ["--steps", str(steps), "--eval-every", str(steps), "--data-dir", str(data_dir)]
    if what == "compare":
        small += ["--workers", "4"]
    if what == "plan":
        small += ["--validate-max-steps", str(2 * steps)]
        small += ["--target-loss", "100"] if "--target-loss" in argv else []
    return argv + small


def _run_in_order(commands: list[list[str]], data_dir, monkeypatch) -> None:
    # each run's own curves.png is most of a tiny run's time; the comparisons and report pages draw
    # their plots themselves (imported first: they keep the real plot_runs), so every page is drawn
    import gradwire.report.compare  # noqa: F401
    import gradwire.report.pages  # noqa: F401

    monkeypatch.setattr("gradwire.report.plots.plot_runs", lambda records, path, *a, **k: path)
    for cmd in commands:
        argv = _small(cmd, data_dir)
        try:
            code = main(argv)
        except SystemExit as e:  # --help
            code = e.code
        assert code == 0, shlex.join(cmd)


@pytest.mark.slow
def test_the_readme_walk_through_runs_in_order(tmp_path, data_dir, monkeypatch, capsys):
    """`make demo`, then every line of the README's "Command line" block, top to bottom, in one
    folder: each exits 0 (the compare line after `make demo` as well)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    assert _makefile_demo() == MAKE_DEMO
    _run_in_order([shlex.split(MAKE_DEMO), *_readme_commands()], data_dir, monkeypatch)
    assert (tmp_path / "runs" / "b2" / "report.html").exists() and (tmp_path / "runs" / "demo-seeds").is_dir()
    assert "already finished at step 4" in capsys.readouterr().out  # the demo's variants, made by `make demo`


@pytest.mark.slow
def test_every_help_example_runs(tmp_path, data_dir, monkeypatch):
    from gradwire.cli.compare import EPILOG as EPILOG_COMPARE
    from gradwire.cli.plan import EPILOG as EPILOG_PLAN
    from gradwire.cli.reproduce import EPILOG as EPILOG_REPRODUCE

    monkeypatch.chdir(tmp_path)
    for name, text in USER_FILES.items():
        (tmp_path / name).write_text(text)
    commands = [*_epilog_commands(EPILOG_RUN, "run"), *_epilog_commands(EPILOG_COMPARE, "compare"),
                *_epilog_commands(EPILOG_PLAN, "plan"), *_epilog_commands(EPILOG_REPRODUCE, "reproduce")]
    assert [c[1] for c in commands] == ["run"] * 4 + ["compare"] + ["plan"] * 4 + ["reproduce"] * 3
    assert all("..." not in c for c in commands)
    _run_in_order(commands, data_dir, monkeypatch)


def test_readme_compressor_snippet(capsys):
    code = _readme_block("## Compressors as a library", "python")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
    assert "bytes on the wire" in capsys.readouterr().out
    assert namespace["g_hat"].shape == namespace["g"].shape
    assert namespace["ef"].residual("layer1") is not None
