"""The byte ledger of the backends whose processes count separately (threads here, torch.distributed
alike): subgroup bytes that wait for ``sync_counters`` survive a checkpoint, the collectives' payloads
are not kept after every member has read them, and the counts equal the simulator's."""

from __future__ import annotations

import threading

import pytest
import torch

from gradwire.run.loop import run
from gradwire.transports.threads import Hub, ThreadTransport
from tests.helpers import read_jsonl

LSGD = dict(algorithm="lsgd:groups=2,period=2", seed=1, eval_every=8, checkpoint_every=4, timeout_s=60)


def test_subgroup_bytes_pending_at_a_checkpoint_survive_the_resume(make_config):
    """Multi-leader LSGD's group collectives are counted by each group's lowest rank until the next
    evaluation step; a checkpoint between two (step 4, evaluations at 8) holds them, so the run stopped
    at step 5 and resumed from step 4 ends with the bytes of the run that never stopped, which are the
    simulator's on the ring."""
    whole = run(make_config(LSGD, steps=8, backend="threads", out="whole"), progress=False)
    cut = make_config(LSGD, steps=5, backend="threads", out="cut")
    run(cut, progress=False)
    resumed = run(cut.replace(steps=8, resume=True), progress=False)
    sim = run(make_config(LSGD, steps=8, network="ring", out="sim"), progress=False)
    assert resumed["resumed_from_step"] == 4
    assert resumed["bytes_sent"] == whole["bytes_sent"] == sim["bytes_sent"] > 0
    last = read_jsonl(cut.out + "/metrics.jsonl")[-1]
    assert last["step"] == 8 and last["bytes_sent"] == whole["bytes_sent"]


def _threads(world: int) -> tuple[Hub, list[ThreadTransport]]:
    hub = Hub(timeout_s=10)
    return hub, [ThreadTransport(hub, world, r) for r in range(world)]


def _on_every_rank(transports, call) -> list:
    out = [None] * len(transports)

    def one(t):
        out[t.rank] = call(t)

    threads = [threading.Thread(target=one, args=(t,)) for t in transports]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    return out


def test_the_hub_drops_a_collectives_payloads_once_every_member_has_read_them():
    hub, transports = _threads(3)
    for _ in range(5):
        _on_every_rank(transports, lambda t: t.allreduce_mean({t.rank: torch.ones(1000) * t.rank}))
        _on_every_rank(transports, lambda t: t.allgather({t.rank: torch.zeros(7, dtype=torch.uint8)}))
        _on_every_rank(transports, lambda t: t.broadcast(torch.arange(4, dtype=torch.uint8), 0, size=4))
        _on_every_rank(transports, lambda t: t.allreduce_mean({t.rank: torch.ones(3)}, [0, 2]) if t.rank != 1 else None)
    assert hub.slots == {} and hub.readers == {}


def test_subgroup_bytes_are_counted_once_by_the_groups_lowest_rank():
    """Three ranks, a subgroup allreduce of ranks 1 and 2: rank 1 holds its bytes until the sync, then
    every rank holds the global count: the ring allreduce of 12 bytes between 2 (2·(2−1)·12/2 each way)."""
    from gradwire.transports import ledger

    _, transports = _threads(3)
    _on_every_rank(transports, lambda t: t.allreduce_mean({t.rank: torch.ones(3)}, [1, 2]) if t.rank else None)
    assert [t.group_bytes for t in transports] == [0, ledger.allreduce(12, 2), 0]
    assert [t.bytes_sent for t in transports] == [0, 0, 0]
    _on_every_rank(transports, lambda t: t.sync_counters())
    assert [t.bytes_sent for t in transports] == [ledger.allreduce(12, 2)] * 3
    assert [t.group_bytes for t in transports] == [0, 0, 0]


def test_uncounted_restores_pending_subgroup_bytes_too():
    _, transports = _threads(2)

    def charged_nothing(t):
        with t.uncounted():
            t.allreduce_mean({t.rank: torch.ones(3)}, [0, 1])
            t.group_bytes += 5  # as a subgroup's collective would leave it
        return t.group_bytes, t.bytes_sent

    assert _on_every_rank(transports, charged_nothing) == [(0, 0), (0, 0)]


@pytest.mark.parametrize("state", [{"bytes_sent": 3, "comm_time_s": 0.5}, {"bytes_sent": 3, "comm_time_s": 0.5,
                                                                             "group_bytes": 7}])
def test_a_transports_state_holds_its_pending_subgroup_bytes(state):
    _, (t,) = _threads(1)
    t.load_state_dict(state)  # a checkpoint from before group_bytes was saved loads with 0 pending
    assert t.group_bytes == state.get("group_bytes", 0) and t.state_dict()["group_bytes"] == t.group_bytes


def test_a_message_is_counted_by_its_sender_and_by_its_receiver_when_it_says_so():
    """Point to point (server mode): each process counts what it sends and what it receives, the
    server's receipt only when it handles the message (``count=False`` ahead, ``count`` later)."""
    from gradwire.transports.base import SERVER

    _, (server, worker) = _threads(2)
    for t in (server, worker):
        t.first_worker_process = 1  # process 0 serves, process 1 hosts worker 0
    worker.send(torch.zeros(40, dtype=torch.uint8), 0, SERVER)
    got = server.recv(40, 0, SERVER, timeout_s=5)
    assert got.numel() == 40 and worker.bytes_sent == 40 and server.bytes_sent == 40
    worker.send(torch.zeros(24, dtype=torch.uint8), 0, SERVER)
    server.recv(24, 0, SERVER, timeout_s=5, count=False)
    assert server.bytes_sent == 40
    server.count(24)
    assert server.bytes_sent == 64
