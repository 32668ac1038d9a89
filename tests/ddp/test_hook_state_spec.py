"""A hook state names its compressor by spec; one saved before a key gained a default still loads."""

from gradwire.compress import build
from gradwire.ddp import resolved_spec


def test_a_spec_saved_without_a_later_default_resolves_to_todays():
    old = "qsgd:levels=4,bucket=512"  # as a state saved before qsgd had its format key names it
    assert resolved_spec(old) == build("qsgd:levels=4").spec()
    assert "format=2" in resolved_spec(old)
    assert resolved_spec(old) != resolved_spec("qsgd:levels=8,bucket=512")


def test_an_unknown_spec_is_kept_for_the_error_message():
    assert resolved_spec("nosuchcodec:x=1") == "nosuchcodec:x=1"
