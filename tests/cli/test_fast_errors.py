"""Bad arguments are reported at once, before torch is imported, in one line of one form: the
value, the problem, then the flag ``(--flag)``; a config file that does not parse is named with
its parser's own line, column and message."""

import subprocess
import sys
import textwrap

import pytest

from gradwire.cli import main
from gradwire.config import RunConfig, read_config_file
from gradwire.errors import ConfigError

# (a config with one bad value, the flag its message must end with)
BAD_VALUES = [
    (dict(workers=0), "--workers"), (dict(steps=-1), "--steps"), (dict(eval_every=0), "--eval-every"),
    (dict(threads=0), "--threads"), (dict(batch_size="half"), "--batch-size"), (dict(batch_size=0), "--batch-size"),
    (dict(dtype="float16"), "--dtype"), (dict(lr=0.0), "--lr"), (dict(lr=float("nan")), "--lr"),
    (dict(momentum=1.0), "--momentum"),  # --nesterov with a --momentum 0 is the second stage's (test_combination.py):
    # the algorithm says first whether --nesterov applies to it at all (diloco's inner AdamW)
    (dict(nesterov=True, optimizer="adamw"), "--nesterov"), (dict(nesterov=True, momentum=0.9, optimizer="muon"),
                                                             "--nesterov"),
    (dict(weight_decay=-1.0), "--weight-decay"), (dict(momentum=0.9, optimizer="adamw"), "--momentum"),
    (dict(seed=-1), "--seed"), (dict(backend="mpi"), "--backend"), (dict(device="tpu"), "--device"),
    (dict(checkpoint_every=-2), "--checkpoint-every"), (dict(timeout_s=0.0), "--timeout-s"),
]


@pytest.mark.parametrize("bad, flag", BAD_VALUES, ids=[f"{flag}-{i}" for i, (_, flag) in enumerate(BAD_VALUES)])
def test_every_value_error_names_its_key_and_its_flag_in_one_form(bad, flag, tmp_path):
    with pytest.raises(ConfigError) as e:
        RunConfig(out=str(tmp_path / "o"), **bad).check_values()
    message = str(e.value)
    key = flag[2:].replace("-", "_")
    assert message.startswith(f"{key}=") and message.endswith(f"({flag})"), message
    assert "\n" not in message


@pytest.mark.parametrize("flag, value", [("--workers", "zero"), ("--lr", "fast"), ("--resume", "maybe")])
def test_a_value_of_the_wrong_type_names_its_flag(flag, value, capsys):
    from gradwire.config import coerce

    with pytest.raises(ConfigError, match=rf"is not a valid \w+(: write [^()]+)? \({flag}\)$"):
        coerce(flag[2:].replace("-", "_"), value)


@pytest.mark.parametrize("text, where, problem", [
    ("workers: 4\n  steps: [1\n", "line 2, column 8", "mapping values are not allowed here"),
    ("a: [1, 2\nb: 3\n", "line 2, column 2",
     "expected ',' or ']', but got ':' (while parsing a flow sequence that starts at line 1, column 4)"),
])
def test_a_yaml_error_names_the_file_and_keeps_the_parsers_message(tmp_path, capsys, text, where, problem):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_config_file(path)
    assert str(e.value) == f"cannot parse config file {str(path)!r}: {where}: {problem}"
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gradwire run: error: cannot parse config file {str(path)!r}: {where}: {problem}"]
    assert "<unicode string>" not in err[0]


def test_a_toml_error_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("workers = 4\nsteps = \n")
    with pytest.raises(ConfigError, match=r"config file '.*run.toml': Invalid value \(at line 2, column 9\)"):
        read_config_file(path)


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_bad_arguments_are_reported_before_torch_is_imported(tmp_path):
    """In a fresh interpreter: the command line's own checks of a bad value, a bad flag, --help and a
    broken config file, and the checks of every value that needs no registry, import no torch (which
    costs seconds: benchmarks/time_to_typo.py)."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("workers: [4\n")
    code = textwrap.dedent(f"""
        import contextlib, io, sys
        from gradwire.cli import main
        from gradwire.config import RunConfig
        from gradwire.errors import ConfigError
        for argv in (["run", "--workers", "0"], ["run", "--lr", "-1"], ["plan", "--eval-every", "0"],
                     ["compare", "--steps", "0", "--variant", "--algorithm sync"],
                     ["run", "--config", {str(broken)!r}], ["run", "--wokers", "2"],
                     ["rn"], ["--help"], ["run", "--help"]):
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                try:
                    code = main(argv)
                except SystemExit as e:
                    code = e.code
            assert code == (0 if "--help" in argv else 2), (argv, code)
        try:
            RunConfig(workers=0).validate()
        except ConfigError:
            pass
        print("torch" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"

