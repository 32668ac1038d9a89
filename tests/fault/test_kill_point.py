"""GRADWIRE_KILL_AT (fault/kill.py): which event kills which process; in process, the kill watched."""

import pytest

from gradwire.errors import ConfigError
from gradwire.fault.kill import KillAt, fault_point_from_env


def kills(spec: str, events: list[tuple[int, str]], local_ranks=(1,)) -> list[tuple[int, str]]:
    """The events at which the fault point of ``spec`` would kill this process."""
    point, hits = KillAt(spec, local_ranks), []
    for event in events:
        point.kill = lambda event=event: hits.append(event)
        point(*event)
    return hits


def test_a_step_or_a_send_kills_at_that_step_only_the_process_hosting_the_worker():
    events = [(s, phase) for s in (1, 2, 3) for phase in ("sent", "step")]
    assert kills("1:2", events) == [(2, "step")]
    assert kills("1:2:sent", events) == [(2, "sent")]
    assert kills("1:2", events, local_ranks=(0,)) == []


def test_unacked_kills_right_after_saving_that_checkpoints_part():
    assert kills("1:10:unacked", [(5, "saved"), (10, "step"), (10, "sent")]) == []
    assert kills("1:10:unacked", [(5, "saved"), (10, "step"), (10, "saved"), (15, "saved")]) == [(10, "saved")]


def test_saved_kills_at_the_first_step_at_or_past_after_a_part_was_saved():
    assert kills("1:2:saved", [(1, "step"), (2, "step"), (3, "step")]) == []  # nothing saved yet
    assert kills("1:2:saved", [(1, "step"), (4, "saved"), (2, "sent"), (5, "step")]) == [(5, "step")]


def test_only_the_first_torch_attempt_is_killed_and_a_bad_spec_is_one_line():
    env = {"GRADWIRE_KILL_AT": "1:3"}
    assert isinstance(fault_point_from_env(env, "torch", (1,)), KillAt)
    assert fault_point_from_env(env, "sim", (1,)) is None
    assert fault_point_from_env(env | {"TORCHELASTIC_RESTART_COUNT": "1"}, "torch", (1,)) is None
    assert fault_point_from_env({}, "torch", (1,)) is None
    with pytest.raises(ConfigError, match="GRADWIRE_KILL_AT='1:3:later' must be WORKER:STEP"):
        KillAt("1:3:later", (1,))


@pytest.mark.parametrize("variable, value, fields, text, want", [
    ("GRADWIRE_FT_FULL_AT", "3, 5,", 1, False, ["3", "5"]),
    ("GRADWIRE_FT_LEAVE_AT", "1:7", 2, False, [["1", "7"]]),
    ("GRADWIRE_FT_LEAVE_AT", "0:5,1:7", 2, False, [["0", "5"], ["1", "7"]]),  # each replica its own step
    ("GRADWIRE_FT_HOLD_AT", "4:/tmp/a:b,6:/f", 2, True, [["4", "/tmp/a:b"], ["6", "/f"]]),
    ("GRADWIRE_FT_FULL_AT", "", 1, False, []),
])
def test_the_replicas_fault_scripts_read_their_forms(monkeypatch, variable, value, fields, text, want):
    from gradwire.fault.replica import scripted_steps

    monkeypatch.setenv(variable, value)
    assert scripted_steps(variable, "FORM", fields=fields, last_is_text=text) == want


@pytest.mark.parametrize("variable, value, fields, text", [
    ("GRADWIRE_FT_FULL_AT", "3,x", 1, False),
    ("GRADWIRE_FT_LEAVE_AT", "1", 2, False),
    ("GRADWIRE_FT_LEAVE_AT", "1:", 2, False),
    ("GRADWIRE_FT_LEAVE_AT", "a:2", 2, False),
    ("GRADWIRE_FT_HOLD_AT", "x:/f", 2, True),
    ("GRADWIRE_FT_HOLD_AT", "4:", 2, True),  # no file: Path("") is ".", which always exists
    ("GRADWIRE_FT_FULL_AT", "\u00b2", 1, False),  # a digit to str.isdigit, not to int()
])
def test_a_malformed_fault_script_names_its_variable_and_form(monkeypatch, variable, value, fields, text):
    from gradwire.fault.replica import scripted_steps

    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"{variable}=.* must be FORM"):
        scripted_steps(variable, "FORM", fields=fields, last_is_text=text)
