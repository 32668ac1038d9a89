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


def test_a_simulated_clock_adds_each_advance_and_resumes_from_its_reading():
    """Simulated seconds only pass by ``advance``, which adds; a resumed clock reads what it read at
    the checkpoint (sums of dyadic numbers: exact in float64)."""
    from gradwire.transports.clocks import SimClock

    clock = SimClock()
    clock.advance(1.5)
    clock.advance(0.25)
    assert clock.now == 1.75 and clock.state_dict() == {"now": 1.75}
    resumed = SimClock()
    resumed.load_state_dict(clock.state_dict())
    resumed.advance(0.5)
    assert resumed.now == 2.25
