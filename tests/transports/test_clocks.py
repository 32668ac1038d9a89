"""The real backends' clock: real seconds since the run started, continued across a resume from
the checkpoint's reading (sim_time_s on a real backend). Time is scripted, not measured."""

from gradwire.transports import clocks
from gradwire.transports.clocks import WallClock


def test_a_resumed_wall_clock_goes_on_from_the_checkpoints_reading(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(clocks.time, "perf_counter", lambda: now[0])
    first = WallClock()
    now[0] += 42.5
    state = first.state_dict()
    assert state == {"now": 42.5}
    now[0] += 3600.0  # the run was stopped for an hour, then resumed in a new process
    resumed = WallClock()
    resumed.load_state_dict(state)
    assert resumed.now == 42.5
    now[0] += 7.0
    assert resumed.now == 49.5
    resumed.advance(100.0)  # time passes by itself: advancing or setting it changes nothing
    resumed.now = 0.0
    assert resumed.now == 49.5
