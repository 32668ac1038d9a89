"""Each claim's verdict follows from its stated criteria: constructed measurements, exact verdicts."""

from __future__ import annotations

import pytest

from gradwire.reproduce import backup_workers, dagc, dasgd, diana_exact, diana_norms, dqsgd, lsgd_easgd, lsgd_symmetry
from gradwire.reproduce.claim import Check, judge_checks


def verdict(checks):
    return judge_checks(checks)[0]


def passed(checks):
    return [c.passed for c in checks]


def test_judge_checks_all_some_none_and_the_reason_names_each_check():
    ok, bad = Check("a holds", True, "1 vs 2"), Check("b holds", False, "3 vs 4", "because c")
    assert judge_checks([ok, ok])[0] == "reproduced"
    v, reason = judge_checks([ok, bad])
    assert v == "partly"
    assert reason == "1 of 2 criteria hold. [PASS: a holds (1 vs 2)] [FAIL: b holds (3 vs 4); because c]"
    assert judge_checks([bad])[0] == "not"
    with pytest.raises(ValueError):
        judge_checks([])
    # a precondition makes the comparison fair; it is not part of the claim
    fair, unfair = Check("same bytes", True, "", precondition=True), Check("same bytes", False, "", precondition=True)
    assert judge_checks([fair, bad])[0] == "not" and judge_checks([fair, ok])[0] == "reproduced"
    v, reason = judge_checks([unfair, ok])
    assert v == "not" and reason.startswith("the comparison is not fair: 1 precondition(s) fail. 1 of 1 criteria")
    assert "[FAIL: precondition: same bytes ()]" in reason
    with pytest.raises(ValueError):
        judge_checks([fair])


def backups(t_sync, t_b, t_a, acc_b, acc_a, ran_sync=90.0, ran_a=30.0):
    def v(t, acc, ran=40.0):
        return {"time_to_target": t, "final_acc": acc, "sim_time_s": ran}
    return {"target_acc": 0.6, "sync": v(t_sync, 0.63, ran_sync), "backups": v(t_b, acc_b),
            "async": v(t_a, acc_a, ran_a)}


def test_backup_workers():
    assert passed(backup_workers.judge(backups(60.0, 15.0, None, 0.61, 0.55))) == [True, True, True]
    assert passed(backup_workers.judge(backups(60.0, 48.0, 47.0, 0.61, 0.55))) == [True, False, True]
    # "no later than" includes a tie, and "in <= 80 %" its bound
    assert passed(backup_workers.judge(backups(60.0, 48.0, 48.0, 0.61, 0.55))) == [True, True, True]
    assert passed(backup_workers.judge(backups(60.0, 48.1, 40.0, 0.55, 0.55))) == [False, False, False]
    assert verdict(backup_workers.judge(backups(None, None, None, 0.5, 0.4))) == "partly"  # nobody reached it
    # async never reached the target but stopped (9 s) before the backups reached it (11 s): not seen slower
    assert passed(backup_workers.judge(backups(60.0, 11.0, None, 0.61, 0.55, ran_a=9.0)))[1] is False
    assert passed(backup_workers.judge(backups(60.0, 11.0, None, 0.61, 0.55, ran_a=11.0)))[1] is True
    # sync never reached it within its run: faster than 0.8 of that run only
    assert passed(backup_workers.judge(backups(None, 50.0, None, 0.61, 0.55, ran_sync=60.0)))[0] is False
    assert passed(backup_workers.judge(backups(None, 48.0, None, 0.61, 0.55, ran_sync=60.0)))[0] is True
    # "higher" needs more than a tie (half a point), as every "beats" of the claims does
    assert passed(backup_workers.judge(backups(60.0, 15.0, None, 0.565, 0.5601)))[2] is False
    assert passed(backup_workers.judge(backups(60.0, 15.0, None, 0.566, 0.5601)))[2] is True


def test_diana_optimum():
    m = {"final": {"DIANA": 5.6e-17}, "floor": {k: 3e-4 for k in diana_exact.BASELINES}}
    assert verdict(diana_exact.judge(m)) == "reproduced"
    m["floor"]["TernGrad"] = 9.9e-9
    assert passed(diana_exact.judge(m)) == [True, True, False, True]
    m["final"]["DIANA"] = 1.1e-10
    assert passed(diana_exact.judge(m))[0] is False


def test_diana_norms():
    lab = diana_norms.label
    assert diana_norms.BLOCKS == (5, 20, 100)
    s = {lab("inf", 5): 70, lab("2", 5): 75, lab("inf", 20): 75, lab("2", 20): 90, lab("inf", 100): 80,
         lab("2", 100): None}
    assert verdict(diana_norms.judge({"steps_to_eps": s})) == "reproduced"
    s |= {lab("inf", 5): 75, lab("inf", 100): 75}  # l-inf: the same steps at every block size (ties are "no more")
    assert passed(diana_norms.judge({"steps_to_eps": s})) == [True, True, True, False]
    s[lab("inf", 20)] = 95  # slower than l2 at block 20, and not monotone in the block size
    assert passed(diana_norms.judge({"steps_to_eps": s})) == [False, True, True, False]
    s[lab("inf", 100)] = None  # never reached with the whole vector: not fewer steps than l2's never, but then
    assert passed(diana_norms.judge({"steps_to_eps": s})) == [False, False, True, True]  # 75, 95, never is monotone
    quick = {"blocks": [5, 100], "steps_to_eps": {lab("inf", 5): 75, lab("2", 5): 80, lab("inf", 100): 90,
                                                  lab("2", 100): 90}}  # --quick runs two block sizes
    assert passed(diana_norms.judge(quick)) == [True, False, True, True]
    # the same bytes per step for l2 and l-inf at each block size is a precondition: unequal is "not"
    per = {lab(p, b): 1600.0 if b == 5 else 384.0 for p in ("inf", "2") for b in (5, 100)}
    assert passed(diana_norms.judge(quick | {"bytes_per_step": per}))[0] is True
    assert verdict(diana_norms.judge(quick | {"bytes_per_step": per | {lab("inf", 5): 1700.0}})) == "not"


def test_lsgd_symmetry_counts_seeds():
    m = {"lsgd_f": [0.01, 0.02, 0.05, 0.3], "easgd_f": [1.0, 1.0, 0.99, 0.2]}
    assert verdict(lsgd_symmetry.judge(m)) == "reproduced"  # 3 of 4 = 75% each
    m["lsgd_f"][0] = 0.1  # f < 0.1 is a minimum, 0.1 is not
    assert passed(lsgd_symmetry.judge(m)) == [False, True]


def test_lsgd_easgd():
    def m(lsgd, easgd, local, sync):
        return {k: {"early": e, "final": f} for k, (e, f) in
                zip(("lsgd", "easgd", "local", "sync"), (lsgd, easgd, local, sync))}
    assert passed(lsgd_easgd.judge(m((0.5, 0.70), (0.4, 0.69), (0.5, 0.68), (0.5, 0.694)))) == [True, True, True]
    assert passed(lsgd_easgd.judge(m((0.5, 0.66), (0.49, 0.664), (0.5, 0.657), (0.5, 0.652)))) == [True, True, False]
    assert verdict(lsgd_easgd.judge(m((0.4, 0.6), (0.5, 0.7), (0.5, 0.7), (0.5, 0.7)))) == "not"
    # early: ahead by 0.004 is level; final: 0.004 behind EASGD is level; sync absent (--quick)
    quick = {k: v for k, v in m((0.5, 0.70), (0.496, 0.704), (0.5, 0.69), (0, 0)).items() if k != "sync"}
    assert passed(lsgd_easgd.judge(quick)) == [False, True, True]


def test_dagc():
    (u, d), (fu, fd) = dagc.PAIRS["step"], dagc.PAIRS["fedavg"]

    def m(mb_d, mid_d, tail_d, fed_d, fed_mb_d=2.0):
        return {"step": {u: {"mb": 10.0, "acc_mid": 0.5, "tail": 0.8},
                         d: {"mb": mb_d, "acc_mid": mid_d, "tail": tail_d}},
                "fedavg": {fu: {"tail": 0.7, "mb": 2.0}, fd: {"tail": fed_d, "mb": fed_mb_d}}}
    assert verdict(dagc.judge(m(10.2, 0.55, 0.8, 0.75))) == "reproduced"
    assert verdict(dagc.judge(m(10.2, 0.55, 0.8, 0.75, fed_mb_d=4.0))) == "not"  # FedAvg pair: twice the bytes
    assert passed(dagc.judge(m(10.21, 0.5, 0.79, 0.7))) == [False, False, False, False]
    assert verdict(dagc.judge(m(10.21, 0.55, 0.8, 0.75))) == "not"  # 2.1% more bytes: not a fair comparison
    assert verdict(dagc.judge(m(9.79, 0.55, 0.8, 0.75))) == "not"  # 2.1% fewer: not a fair comparison either
    assert passed(dagc.judge(m(9.9, 0.6, 0.79, 0.71))) == [True, True, False, True]


def test_dqsgd():
    def m(mb, tail, first, last):
        return {dqsgd.FIXED: {"mb": 400.0, "tail": 0.9}, dqsgd.BUDGET: {"mb": mb, "tail": tail},
                "bits": {"first_quarter": first, "last_quarter": last}}
    assert verdict(dqsgd.judge(m(410.0, 0.92, 3.0, 3.3))) == "reproduced"
    assert passed(dqsgd.judge(m(421.0, 0.92, 3.3, 3.0))) == [False, True, False]
    assert verdict(dqsgd.judge(m(421.0, 0.92, 3.0, 3.3))) == "not"  # 5.25% more bytes: unfair
    assert verdict(dqsgd.judge(m(379.0, 0.92, 3.0, 3.3))) == "not"  # 5.25% fewer: unfair the other way
    assert verdict(dqsgd.judge(m(400.0, 0.9, 3.3, 3.0))) == "not"  # fair, but neither claim holds
    assert verdict(dqsgd.judge(m(390.0, 0.92, 3.0, 3.0))) == "partly"
    assert passed(dqsgd.judge(m(400.0, 0.904, 3.0, 3.0)))[1] is False  # "beats" needs more than half a point
    assert passed(dqsgd.judge(m(400.0, 0.906, 3.0, 3.0)))[1] is True


def test_dasgd():
    assert dasgd.hidden_share(20.0, 20.0, 1.43) == 1.0
    assert dasgd.hidden_share(22.1, 20.0, 1.4) == pytest.approx(-0.5)  # exposed more than communicated: a slow merge

    def m(hidden, step_ms, acc):
        return {"local": {"hidden": 0.0, "step_ms": 27.2, "final_acc": 0.8},
                "dasgd": {"hidden": hidden, "step_ms": step_ms, "final_acc": acc}}
    assert verdict(dasgd.judge(m(1.0, 20.0, 0.79))) == "reproduced"
    assert passed(dasgd.judge(m(0.7, 22.1, 0.78))) == [False, True, True]
    assert passed(dasgd.judge(m(0.95, 24.6, 0.779))) == [True, False, False]
