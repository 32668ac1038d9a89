"""A replica's link degraded, then cut, then back (network namespaces, gloo, 3 torchft replicas).

Replicas 0 and 1 and the Lighthouse run in one network namespace, replica 2 in another, joined
by one veth link (gradwire/fault/netns.py). The link is throttled (tc tbf, 1 Mbit/s, a 4 kB
burst) for steps 3 to KILL, where each step's allreduce of digits-mlp's 19 kB of parameters
crosses it in chunks larger than the burst (the bucket's counters show the rate limit holding them
back, so a throttle that did nothing fails the test), then cut (side a's end set down: a
partition, no process is signalled) after step KILL (the replicas wait for the test at those two
points: GRADWIRE_FT_HOLD_AT), and restored once
replica 0 has committed step BACK-1: the survivors go on without replica 2, which is dropped from
the quorum; back on the network it finds itself behind, recovers from a peer and ends
bit-identical to them; and the whole run equals, bitwise, a fault-free run replayed with the same
sequence of quorums (replica 2 leaving cleanly after step KILL and restarted for step BACK).
Needs root and iproute2; skipped, with the reason, elsewhere.
"""

from __future__ import annotations

import pytest
import torch

from gradwire.transports import ledger
from tests.fault.test_ft_replicas import (
    BACK,
    BATCH,
    HEARTBEAT_MS,
    JOIN_MS,
    KILL,
    STEPS,
    WAIT_S,
    check_ledger,
    differing,
    final_state,
    replicas_run,
)
from tests.helpers import read_jsonl

pytest.importorskip("torchft")


@pytest.fixture
def link():
    from gradwire.fault.netns import Link, unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"{reason}: the cut-link test partitions a replica in a network namespace")
    made = Link()
    yield made
    made.close()


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_link_degraded_then_cut_survivors_go_on_replica_rejoins_and_equals_a_replay(tmp_path, data_dir, link):
    from gradwire.fault.harness import ReplicaSet

    # dense sync: each step's bytes are a formula; digits-mlp (4810 float32): a step's allreduce
    # crosses the link in chunks (a ring's, B/3 each) beyond the throttle's 4 kB burst
    algorithm = ["--task", "digits-mlp", "--algorithm", "sync"]
    args = [*algorithm, "--steps", str(STEPS), "--eval-every", str(STEPS), "--checkpoint-every", str(STEPS),
            "--batch-size", str(BATCH), "--data-dir", str(data_dir), "--no-curves"]  # as replicas_run has them
    # timeout_s=3: a collective in flight when the link goes down fails after 3 s, not the default 10
    # every replica waits after steps 2 and KILL until the test has changed the link (fault/replica.py)
    throttled, cut = tmp_path / "throttled", tmp_path / "cut-done"
    rs = ReplicaSet(tmp_path / "cut", args, replicas=3, min_replicas=2, timeout_s=3, join_timeout_ms=JOIN_MS,
                    heartbeat_timeout_ms=HEARTBEAT_MS,
                    env={"GRADWIRE_FT_FULL_AT": str(BACK), "GRADWIRE_FT_HOLD_AT": f"2:{throttled},{KILL}:{cut}"},
                    link=link, sides={0: "a", 1: "a", 2: "b"})
    try:
        rs.start_all()
        for k in range(3):
            rs.wait_for_step(k, 2, WAIT_S)
        link.throttle("1mbit", burst="4kb")  # degraded: every replica still takes part
        throttled.touch()
        for k in range(3):
            rs.wait_for_step(k, KILL, WAIT_S)
        paced = link.stats()  # (before the qdisc and its counters go)
        link.unthrottle()
        link.cut()
        cut.touch()
        rs.wait_for_step(0, BACK - 1, WAIT_S)  # the survivors went on while replica 2 was cut off
        link.restore()
        codes = [rs.wait(k, WAIT_S) for k in range(3)]
        assert codes == [0, 0, 0], "\n".join(rs.log(k)[-2000:] for k in range(3))
    finally:
        rs.close()
    faulty = {k: read_jsonl(rs.folder(k) / "steps.jsonl") for k in range(3)}
    survivor = faulty[0]
    assert [r["step"] for r in survivor] == list(range(1, STEPS + 1))
    who = [r["ft"]["participants"] for r in survivor]
    # all three through the throttled steps and up to the cut; the two survivors from the next step to
    # BACK-1 (replica 2 dropped from the quorum); all three again from BACK
    last = KILL
    assert who == [[0, 1, 2]] * last + [[0, 1]] * (BACK - 1 - last) + [[0, 1, 2]] * (STEPS - BACK + 1), who
    healed = [r for r in faulty[2] if "healed" in r["ft"]]
    assert len(healed) == 1 and healed[0]["step"] == BACK and healed[0]["ft"]["healed"]["at_step"] == BACK - 1
    assert [r["step"] for r in faulty[2] if r["step"] >= BACK] == list(range(BACK, STEPS + 1))
    for r, mine in zip(survivor[BACK - 1:], faulty[2][-(STEPS - BACK + 1):], strict=True):
        assert r["bytes_sent"] == mine["bytes_sent"] and r["ft"]["participants"] == mine["ft"]["participants"]
    assert [rec[-1]["ft"]["skipped_samples"] for rec in faulty.values()] == [BATCH * (BACK - 1 - last)] * 3
    states = [final_state(rs.folder(k))["algorithm"] for k in range(3)]
    gradient = states[0]["x"].numel() * states[0]["x"].element_size()  # one dense allreduce a step
    # the throttle acted on the steps' traffic: each end's token bucket carried at least the share of
    # steps 3..KILL's allreduces that must cross the link ((n-1)/n of the buffer each way, a step) and
    # held packets back for want of tokens (overlimits: traffic beyond the burst, paced to the rate)
    for side in "ab":
        assert paced[side]["kind"] == "tbf", paced
        assert paced[side]["sent_bytes"] >= (KILL - 2) * gradient * 2 // 3, (paced, gradient)
        assert paced[side]["overlimits"] > 0, paced
    check_ledger(survivor, {BACK: healed[0]["ft"]["healed"]["bytes"]}, {1, last + 1, BACK},
                 lambda n, step: ledger.allreduce(gradient, n))
    assert all(torch.equal(s["x"], states[0]["x"]) for s in states[1:])  # bit-identical after the rejoin

    # the replay: the same quorums without a fault (on loopback: where a replica runs changes no result)
    code, replay_rs, replay = replicas_run(tmp_path / "replay", data_dir, algorithm,
                                           {"GRADWIRE_FT_LEAVE_AT": f"2:{last}"})
    assert code == 0
    for k in range(3):
        mine = faulty[k] if k < 2 else faulty[2][-(STEPS - BACK + 1):]  # replica 2: from its rejoin on
        assert [r["ft"]["participants"] for r in replay[k]] == [r["ft"]["participants"] for r in mine]
        assert [r["loss"] for r in replay[k]] == [r["loss"] for r in mine]
        assert [r["bytes_sent"] - r["ft"]["exchange_bytes"] for r in replay[k]] == \
            [r["bytes_sent"] - r["ft"]["exchange_bytes"] for r in mine]
    replay_states = [final_state(replay_rs.folder(k))["algorithm"] for k in range(3)]
    for a, b in zip(states, replay_states, strict=True):
        a, b = ({k: v for k, v in s.items() if k != "pace"} for s in (a, b))
        assert differing(a, b) == []
