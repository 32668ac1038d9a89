"""The torch-free table of spec names and keys (src/gradwire/registry_names.py) is the registries'
own, and a mistyped name or key is reported from it with the registries' words, before torch."""

import subprocess
import sys
from pathlib import Path

import pytest

from gradwire.errors import ConfigError
from gradwire.registries import REGISTRIES, check_spec_names, written_names
from gradwire.registry_names import NAMES


def test_the_table_is_current(tmp_path):
    """The committed file is, byte for byte, what its generator writes now."""
    import gradwire.registry_names
    from gradwire.registries import write_names

    assert NAMES == written_names(), "regenerate it: python -m gradwire.registries"
    write_names(tmp_path / "names.py")
    committed = Path(gradwire.registry_names.__file__).read_text()
    assert (tmp_path / "names.py").read_text() == committed, "regenerate it: python -m gradwire.registries"


@pytest.mark.parametrize("key,spec", [("algorithm", "synk"), ("algorithm", "diloco:inner_step=3"),
                                      ("compressor", "qsgdd"), ("compressor", "qsgd:levls=4"),
                                      ("compressor", "powersgd:rnk=2"), ("task", "mnist1d"),
                                      ("stragglers", "tail:q=0.1")])
def test_its_refusals_are_the_registries(key, spec):
    """The same message as the registry's own check (registry_for, then resolve)."""
    from gradwire.registries import registry_for

    with pytest.raises(ConfigError) as table:
        check_spec_names(key, spec)
    with pytest.raises(ConfigError) as registry:
        registry_for(key, spec).registry.resolve(spec)
    assert str(table.value) == str(registry.value)


def test_every_registered_spec_passes():
    for ref in REGISTRIES:
        for name, params in NAMES[ref.group]["names"].items():
            check_spec_names(ref.key, name)
            for k in params:
                check_spec_names(ref.key, f"{name}:{k}=1")  # the value is the registry's to judge


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_mistyped_name_is_reported_before_torch_is_imported(tmp_path):
    code = ("import contextlib, io, sys\n"
            "from gradwire.cli import main\n"
            "for argv in (['run', '--algorithm', 'synk'], ['run', '--compressor', 'qsgd:levls=4'],\n"
            "             ['compare', '--variant', '--algorithm dilco']):\n"
            "    with contextlib.redirect_stderr(io.StringIO()) as err:\n"
            "        code = main(argv)\n"
            "    assert code == 2 and 'valid' in err.getvalue(), (argv, code, err.getvalue())\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
