"""Asynchronous Leader SGD: when rounds happen, who leads them, and how the server serves them.

Teng et al. 2019 (their Fig. 8: at every iteration a worker asks the server, which answers
"local step" or "distributed step"). Workers report every local step (REPORT, the loss as its
value). The reports count local steps in total (and per group): when a count triggers a round,
the leader is elected from the loss windows the reports filled (``AsyncRounds``). The leader's next
answer asks it to upload its parameters as they are then (UPLOAD; it sends LEAD); each other
member's first answer after the upload carries them (PULL, the pull weight as its value), and the
member moves towards them. Both answers carry the round's scope in ``count`` (``GLOBAL_SCOPE``,
or the group's index + 1), so that the worker knows which of its leader snapshots (the targets of
the per-step proximal pull, ``lsgd.py``) the parameters replace. No worker waits for another: a
member whose round has not been uploaded yet steps on and pulls at a later report, and a newer
round of the same scope (group, or global) that has been uploaded supersedes the older ones its
members missed (one never uploaded is then cancelled, so the evaluated leader never goes back to
an older election). A leader lost before uploading cancels its rounds.
"""

from __future__ import annotations

import collections
import dataclasses

import torch

from gradwire.algorithms.protocol import GO, PULL, UPLOAD, Message
from gradwire.algorithms.replicas import LossWindow


@dataclasses.dataclass
class Round:
    """One asynchronous communication round: ``group`` None is a global round."""

    id: int
    group: int | None
    members: list[int]
    leader: int
    score: float   # the leader's running loss, as elected (float32)
    weight: float  # how far each member moves towards the leader

    def state_dict(self) -> dict:
        return {"id": self.id, "group": -1 if self.group is None else self.group, "members": list(self.members),
                "leader": self.leader, "score": torch.tensor(self.score, dtype=torch.float64),
                "weight": torch.tensor(self.weight, dtype=torch.float64)}

    @classmethod
    def from_state(cls, s: dict) -> Round:
        return cls(int(s["id"]), None if int(s["group"]) < 0 else int(s["group"]), [int(m) for m in s["members"]],
                   int(s["leader"]), float(s["score"]), float(s["weight"]))


GLOBAL_SCOPE = 0  # ``count`` of an UPLOAD or PULL for a global round; group k's rounds carry k + 1


def scope_of(rd: Round) -> int:
    return GLOBAL_SCOPE if rd.group is None else rd.group + 1


def _f32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


class AsyncRounds:
    """When the rounds happen and who leads them: fed every local step as it is reported (worker,
    minibatch loss), in arrival order. A worker in ``lost`` is no longer elected."""

    def __init__(self, algo, n: int):
        self.algo = algo
        self.window = LossWindow(range(n), max(algo.window_size, algo.top_window))
        self.done, self.group_done, self.next_id = 0, [0] * len(algo.members), 1
        self.lost: set[int] = set()

    def _round(self, group: int | None, members: list[int], window: int, weight: float) -> Round:
        # scores rounded to float32 as the synchronous election sends them, so ties break alike
        scores = {r: _f32(self.window.mean(r, window)) for r in members if r not in self.lost}
        leader = min(scores, key=lambda r: (scores[r], r))
        self.next_id += 1
        return Round(self.next_id - 1, group, list(members), leader, scores[leader], weight)

    def completed(self, rank: int, loss: float) -> list[Round]:
        """Worker ``rank`` finished a local step with this loss: the rounds that triggers, in order."""
        algo, rounds = self.algo, []
        self.window.push(rank, loss)
        self.done += 1
        k = algo.group_of[rank]
        self.group_done[k] += 1
        if algo.multi and self.group_done[k] % (algo.period * len(algo.members[k])) == 0:
            rounds.append(self._round(k, algo.members[k], algo.window_size, algo.pull))
        if self.done % (algo.top_period * len(self.window.values)) == 0:
            everyone = sorted(self.window.values)
            rounds.append(self._round(None, everyone, algo.top_window, algo.top_pull))
        return rounds

    def state_dict(self) -> dict:
        return {"window": self.window.state_dict(), "done": self.done, "next_id": self.next_id,
                "group_done": {str(k): d for k, d in enumerate(self.group_done)},
                "lost": sorted(self.lost)}

    def load_state_dict(self, state: dict) -> None:
        self.window.load_state_dict(state["window"])
        self.done, self.next_id = int(state["done"]), int(state["next_id"])
        self.group_done = [int(state["group_done"][str(k)]) for k in range(len(self.group_done))]
        self.lost = {int(w) for w in state["lost"]}


class RoundServer:
    """The server's side of the rounds: which are open, whose parameters have come, who still has
    to receive them. ``serve(w)`` is the answer to worker w's report."""

    def __init__(self, algo, n: int):
        self.algo = algo
        self.rounds = AsyncRounds(algo, n)
        self.open: dict[int, Round] = {}              # rounds some live member still has to receive
        self.uploaded: dict[int, torch.Tensor] = {}   # round id -> the leader's parameters
        self.pending = {w: collections.deque() for w in range(n)}  # each worker's rounds, in order
        self.newest_uploaded: dict[int | None, int] = {}  # scope -> newest round whose parameters came
        self.triggered = {"global": 0, "group": 0}
        self.late_uploads = 0  # leaders' parameters that arrived after the last step

    def report(self, w: int, loss: float) -> list[Round]:
        """Worker w reported a local step: the rounds it triggers, opened and queued for their members."""
        rounds = self.rounds.completed(w, loss)
        for rd in rounds:
            self.open[rd.id] = rd
            self.triggered["global" if rd.group is None else "group"] += 1
            for m in rd.members:
                if m not in self.rounds.lost:
                    self.pending[m].append(rd.id)
        return rounds

    def _close_if_done(self, rid: int) -> None:
        """Forget a round once its parameters have arrived and no member still has to receive them."""
        if rid in self.open and rid in self.uploaded and not any(rid in self.pending[m]
                                                                 for m in self.open[rid].members):
            del self.open[rid], self.uploaded[rid]

    def _cancel(self, rid: int, why: str, info: dict) -> None:
        """Drop a round whose parameters were never sent: its members carry on without it."""
        info[why] = info.get(why, 0) + 1
        for m in self.open[rid].members:
            if rid in self.pending[m]:
                self.pending[m].remove(rid)
        del self.open[rid]
        self.uploaded.pop(rid, None)

    def _superseded(self, rid: int) -> bool:
        return rid < self.newest_uploaded.get(self.open[rid].group, 0)

    def serve(self, w: int, finished: bool, info: dict) -> Message:
        """Rounds older than the newest uploaded round of their scope are dropped first (their pulls
        would be undone by the newer one); then a round w leads and has not uploaded; otherwise the
        oldest round whose parameters are here; otherwise GO."""
        pending = self.pending[w]
        if finished or not pending:
            return Message(GO, w)
        for rid in list(pending):
            if rid in pending and self._superseded(rid):
                if self.open[rid].leader == w and rid not in self.uploaded:
                    self._cancel(rid, "superseded", info)
                else:
                    pending.remove(rid)
                    info["superseded"] = info.get("superseded", 0) + 1
                    self._close_if_done(rid)
        for rid in pending:
            rd = self.open[rid]
            if rd.leader == w and rid not in self.uploaded:
                pending.remove(rid)
                return Message(UPLOAD, w, tag=rid, count=scope_of(rd))
        ready = [rid for rid in pending if rid in self.uploaded]
        if not ready:
            return Message(GO, w)
        rid = ready[0]
        pending.remove(rid)
        rd = self.open[rid]
        lead = self.uploaded[rid]
        self._close_if_done(rid)
        info["pulls"] = info.get("pulls", 0) + 1
        return Message(PULL, w, tag=rid, count=scope_of(rd), value=rd.weight, body=lead.reshape(-1).view(torch.uint8))

    def lead(self, w: int, rid: int, params: torch.Tensor, finished: bool, info: dict) -> None:
        """Leader w's parameters for round ``rid`` have come."""
        if finished:  # a round that ends with the run: not passed on
            self.late_uploads += 1
            return
        rd = self.open.get(rid)
        if rd is None or self._superseded(rid):  # cancelled meanwhile, or a newer round came first
            info["uploads_superseded"] = info.get("uploads_superseded", 0) + 1
            if rd is not None:
                self._cancel(rid, "superseded", info)
            return
        if rd.leader != w or rid in self.uploaded:
            raise ValueError(f"worker {w} uploaded parameters for round {rid}, which it does not lead")
        lead = params.clone()
        self.uploaded[rid] = lead
        self.newest_uploaded[rd.group] = rid
        self.algo.round_ended(rd, lead, info)
        self._close_if_done(rid)

    def lost(self, w: int, info: dict) -> None:
        self.pending[w].clear()
        self.rounds.lost.add(w)
        for rid in list(self.open):
            if self.open[rid].leader == w and rid not in self.uploaded:
                self._cancel(rid, "cancelled_rounds", info)
            else:
                self._close_if_done(rid)

    def rejoined(self, w: int) -> None:
        self.rounds.lost.discard(w)

    def state_dict(self) -> dict:
        return {"rounds": self.rounds.state_dict(), "open": [rd.state_dict() for rd in self.open.values()],
                "uploaded": {str(rid): t for rid, t in self.uploaded.items()},
                "pending": {str(w): list(q) for w, q in self.pending.items()},
                "newest_uploaded": {str(-1 if g is None else g): r for g, r in self.newest_uploaded.items()},
                "triggered": dict(self.triggered), "late_uploads": self.late_uploads}

    def load_state_dict(self, state: dict) -> None:
        self.rounds.load_state_dict(state["rounds"])
        self.open = {int(s["id"]): Round.from_state(s) for s in state["open"]}
        self.uploaded = {int(rid): t.clone() for rid, t in state["uploaded"].items()}
        self.pending = {w: collections.deque(int(i) for i in state["pending"][str(w)]) for w in self.pending}
        self.newest_uploaded = {None if int(g) < 0 else int(g): int(r) for g, r in state["newest_uploaded"].items()}
        self.triggered = {k: int(v) for k, v in state["triggered"].items()}
        self.late_uploads = int(state["late_uploads"])
