"""The measurements every claim's verdict rests on (``reproduce/claim.py``), on hand-built records:
interpolation, the first evaluation reaching a target, and the head and tail windows."""

import pytest

from gradwire.reproduce.claim import first_reaching, head_mean, interpolate, tail_mean

RECORDS = [{"step": s, "sim_time_s": 0.5 * s, "test_acc": a} for s, a in
           [(0, 0.1), (10, 0.3), (20, 0.5), (30, None), (40, 0.6), (50, 0.7), (60, 0.8), (70, 0.8), (80, 0.9),
            (90, 0.9), (100, 1.0)]]


def test_interpolation_is_linear_between_evaluations_and_none_outside():
    assert interpolate(RECORDS, "step", "test_acc", 15) == pytest.approx(0.4)
    assert interpolate(RECORDS, "step", "test_acc", 30) == pytest.approx(0.55)  # across the missing value
    assert interpolate(RECORDS, "step", "test_acc", 100) == 1.0
    assert interpolate(RECORDS, "step", "test_acc", 101) is None
    assert interpolate(RECORDS, "step", "test_acc", -1) is None


def test_first_reaching_is_the_first_evaluation_at_or_past_the_target():
    assert first_reaching(RECORDS, "test_acc", 0.5) == 10.0  # step 20, 0.5 s a step
    assert first_reaching(RECORDS, "test_acc", 0.55, x_key="step") == 40
    assert first_reaching(RECORDS, "test_acc", 1.01) is None


def test_the_head_and_tail_windows_average_their_own_evaluations():
    assert tail_mean(RECORDS, "test_acc") == pytest.approx((0.9 + 0.9 + 1.0) / 3)  # steps 80-100
    assert tail_mean(RECORDS, "test_acc", fraction=0.5) == pytest.approx((0.7 + 0.8 + 0.8 + 0.9 + 0.9 + 1.0) / 6)
    assert head_mean(RECORDS, "test_acc") == pytest.approx((0.3 + 0.5) / 2)  # steps 10-25, not step 0


def test_dqsgd_takes_the_mean_bits_of_the_first_and_the_last_quarter_of_steps():
    from gradwire.reproduce.dqsgd import bit_quarters

    assert bit_quarters([1, 1, 2, 2, 3, 3, 4, 4]) == {"first_quarter": 1.0, "last_quarter": 4.0}
    assert bit_quarters([5, 1, 1, 1, 1, 1, 1, 1, 9]) == {"first_quarter": 3.0, "last_quarter": 5.0}


def test_dasgd_measures_its_step_on_the_network_and_its_compute_on_the_free_one():
    from gradwire.reproduce.dasgd import measure

    networked = {"sim_time_s": 3.0, "comm_time_s": 2.0, "bytes_sent": 5_000_000, "final": {"test_acc": 0.7}}
    free = {"sim_time_s": 2.0, "comm_time_s": 0.0, "bytes_sent": 0, "final": {"test_acc": 0.7}}
    m = measure(networked, free, steps=100)
    assert m["step_ms"] == pytest.approx(30.0) and m["compute_ms"] == pytest.approx(20.0)
    assert m["hidden"] == pytest.approx(0.5)  # 1 s of its 2 s of communication exposed
    assert (m["comm_s"], m["final_acc"], m["mb_sent"]) == (2.0, 0.7, 5.0)
