"""Replicas on torchft (gloo, loopback): a replica SIGKILLed at a chosen step, the survivors
carrying on, the replica restarted and recovered live from a peer (docs/fault_tolerance.md)."""

from __future__ import annotations

import signal

import pytest
import torch

from gradwire import checkpoint
from tests.helpers import read_jsonl

pytest.importorskip("torchft")

PACE = ["--stragglers", "tail:p=0,compute_s=0.08"]  # a real step time, so that a restart lands mid-run


def final_state(folder):
    stepdir = checkpoint.latest(folder / "checkpoint")
    label = next(p.stem for p in stepdir.glob("rank*.pt"))
    return torch.load(stepdir / f"{label}.pt", weights_only=True)["state"]


def run_with_kill(tmp_path, data_dir, args, *, kill_step: int, steps: int):
    from gradwire.fault.harness import ReplicaSet

    rs = ReplicaSet(tmp_path / "ft", [*args, *PACE, "--steps", str(steps), "--eval-every", str(steps),
                                       "--checkpoint-every", str(steps), "--data-dir", str(data_dir)],
                    replicas=3, min_replicas=2)
    try:
        rs.start_all({2: {"GRADWIRE_KILL_AT": f"2:{kill_step}"}})
        assert rs.wait(2, 120) == -signal.SIGKILL, rs.log(2)[-3000:]
        rs.start(2)
        codes = [rs.wait(k, 180) for k in range(3)]
        assert codes == [0, 0, 0], "\n".join(rs.log(k)[-2000:] for k in range(3))
    finally:
        rs.close()
    return rs, {k: read_jsonl(rs.folder(k) / "steps.jsonl") for k in range(3)}


@pytest.mark.multiprocess
@pytest.mark.parametrize("args", [
    ["--algorithm", "sync", "--compressor", "topk:ratio=0.25", "--error-feedback", "--batch-size", "8"],
    ["--algorithm", "diloco:inner_steps=4", "--batch-size", "8", "--lr", "0.1"],
], ids=["sync-topk-ef", "diloco"])
def test_sigkill_survivors_continue_restarted_replica_recovers_bit_identical(tmp_path, data_dir, args):
    kill, steps = 6, 120
    rs, records = run_with_kill(tmp_path, data_dir, ["--task", "synthetic-logreg", *args], kill_step=kill,
                                steps=steps)
    survivor = records[0]
    assert [r["step"] for r in survivor] == list(range(1, steps + 1))  # every step committed once
    alone = [r for r in survivor if r["ft"]["participants"] == [0, 1]]
    assert alone and alone[0]["step"] <= kill + 2, "the survivors went on without the killed replica"
    assert survivor[-1]["ft"]["participants"] == [0, 1, 2]
    healed = [r for r in records[2] if "healed" in r["ft"]]
    assert len(healed) == 1 and healed[0]["ft"]["healed"]["at_step"] >= kill
    assert healed[0]["ft"]["healed"]["bytes"] > 0
    # the restarted replica's first step is the one after the state it received
    assert records[2][0]["step"] == healed[0]["ft"]["healed"]["at_step"] + 1
    # the survivors' records of the steps they took together with it are its records too
    joined = {r["step"]: r for r in records[2]}
    for r in survivor:
        if r["step"] in joined:
            assert r["ft"]["participants"] == joined[r["step"]]["ft"]["participants"]
            assert r["bytes_sent"] == joined[r["step"]]["bytes_sent"]
    # what the absent replica's shard missed is counted, the same by every replica
    batch = 8
    missed = sum(3 - len(r["ft"]["participants"]) for r in survivor)
    assert missed >= 1
    assert [rec[-1]["ft"]["skipped_samples"] for rec in records.values()] == [missed * batch] * 3
    # every replica ends with the same parameters and algorithm state, to the bit
    states = [final_state(rs.folder(k)) for k in range(3)]
    for key in ("x", "theta"):
        if key in states[0]["algorithm"]:
            for s in states[1:]:
                assert torch.equal(s["algorithm"][key], states[0]["algorithm"][key])
    if "outer" in states[0]["algorithm"]:  # DiLoCo's outer optimizer: transferred, identical
        for s in states[1:]:
            for a, b in zip(torch.utils._pytree.tree_leaves(s["algorithm"]["outer"]),
                            torch.utils._pytree.tree_leaves(states[0]["algorithm"]["outer"]), strict=True):
                assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))
