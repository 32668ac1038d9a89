import re

import pytest

from gradwire.errors import ConfigError
from gradwire.spec import Registry, parse_spec, require

REG = Registry("widget")


@REG.register("box", help="a box", params={"size": "edge length", "soft": "squishy?"})
class Box:
    def __init__(self, *, size: int = 3, soft: bool = False, scale: float = 1.0, label: str = "x"):
        require(size > 0, f"size must be > 0, got {size}")
        self.size, self.soft, self.scale, self.label = size, soft, scale, label


@REG.register("needs", help="has a required key")
def needs(*, depth: float):
    return depth


def test_parse_spec_forms():
    assert parse_spec("qsgd") == ("qsgd", {})
    assert parse_spec(" qsgd:levels=4, bucket=512 ") == ("qsgd", {"levels": "4", "bucket": "512"})


@pytest.mark.parametrize("bad, match", [("", "empty spec ''"), (":a=1", "has no name before ':'"),
                                        ("x:a", "'a' is not of the form key=value"),
                                        ("x:a=", "'a=' is not of the form key=value"),
                                        ("x:=1", "'=1' is not of the form key=value"),
                                        ("x:a=1,a=2", "key 'a' given twice")])
def test_parse_spec_rejects_malformed(bad, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        parse_spec(bad)


def test_build_converts_types():
    b = REG.build("box:size=5,soft=true,scale=inf,label=hello")
    assert (b.size, b.soft, b.scale, b.label) == (5, True, float("inf"), "hello")
    assert REG.build("box").size == 3


def test_unknown_name_lists_valid_names():
    with pytest.raises(ConfigError, match=r"unknown widget 'bx'; valid widgets: box, needs"):
        REG.build("bx")


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError, match=r"no parameter 'sise'; valid parameters: size, soft, scale, label"):
        REG.build("box:sise=3")


def test_bad_value_names_key_and_type():
    with pytest.raises(ConfigError, match=r"size='three' is not a valid int"):
        REG.build("box:size=three")
    with pytest.raises(ConfigError, match="soft='maybe' is not a valid bool"):
        REG.build("box:soft=maybe")
    with pytest.raises(ConfigError, match="scale='nan'"):
        REG.build("box:scale=nan")


def test_range_check_becomes_config_error_with_spec():
    with pytest.raises(ConfigError, match=r"'box:size=0': size must be > 0, got 0"):
        REG.build("box:size=0")


def test_required_key():
    with pytest.raises(ConfigError, match="needs depth"):
        REG.build("needs")
    assert REG.build("needs:depth=2.5") == 2.5


def test_describe_lists_params_with_defaults_and_help():
    text = REG.describe()
    assert "size (int, default 3): edge length" in text
    assert "depth (float, required)" in text


def test_an_empty_string_default_is_shown_as_what_it_resolves_to():
    """``gradwire list`` printed ``eval (str, default ): ...`` for lsgd, whose eval="" resolves to average
    (leader with async=true); a registered shown default says so, and an empty default without one
    is shown as ''. No registered parameter prints an empty default."""
    from gradwire.registries import REGISTRIES
    from gradwire.spec import Param

    assert Param("mode", str, "").describe() == "mode (str, default '')"
    assert Param("mode", str, "", "how", "a (b otherwise)").describe() == "mode (str, default a (b otherwise)): how"
    text = "\n".join(ref.registry.describe() for ref in REGISTRIES)
    assert "eval (str, default average (leader with async=true)): what is evaluated" in text
    assert not re.search(r"default \)|default ''", text)
    with pytest.raises(RuntimeError, match=r"shown defaults for no parameter .*\['sise'\]"):
        Registry("gadget").register("g", help="g", shown_defaults={"sise": "3"})(Box)


def test_a_bad_bool_lists_the_accepted_spellings(tmp_path, capsys):
    """``sign:scaled=maybe`` said only "is not a valid bool"; a spec and a config file read bools with
    one parser (the config file took no on/off), and its error lists the spellings."""
    from gradwire.cli import main

    with pytest.raises(ConfigError, match=re.escape("soft='maybe' is not a valid bool: write true/false, yes/no, "
                                                    "on/off or 1/0")):
        REG.build("box:soft=maybe")
    assert REG.build("box:soft=ON").soft is True and REG.build("box:soft=No").soft is False
    assert main(["run", "--compressor", "sign:scaled=maybe", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("gradwire run: error: compressor 'sign': scaled='maybe' is not a valid bool: "
                                       "write true/false, yes/no, on/off or 1/0 (--compressor)\n")
    config = tmp_path / "c.yaml"
    config.write_text("curves: maybe\n")
    assert main(["run", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("gradwire run: error: curves='maybe' is not a valid bool: write true/false, "
                                       "yes/no, on/off or 1/0 (--curves)\n")
    config.write_text("curves: 'off'\n")
    from gradwire.cli.flags import config_from_args, run_parser

    assert config_from_args(run_parser("t").parse_args(["--config", str(config)])).curves is False
    assert not (tmp_path / "o").exists()
