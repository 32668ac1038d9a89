"""Coordinator mode of the torch backend: asynchronous LSGD and asynchronous EASGD for real.

Process 0 coordinates; process w+1 hosts worker w with its own replica, stepping at its own pace.
After every local step a worker reports to the coordinator and waits for its answer, so the
coordinator sees every local step in the order they complete, as the simulator's event queue
does, and runs the algorithm's own arithmetic on them:

- async EASGD (``EASGD.elastic_at_center``): a report after τ of the worker's own steps carries
  x_i; the coordinator computes e = α (x_i - x̃), applies x̃ <- x̃ + e and answers with e, which
  the worker subtracts. Other reports are answered with a bare header.
- async LSGD (``AsyncRounds.completed``): the reports count local steps in total (and per group);
  when a count triggers a round, the leader is elected from the loss windows the reports filled.
  The leader's next answer asks it to upload its parameters as they are then; each other member's
  first answer after the upload carries them, and the member pulls towards them. This is the
  paper's own scheme (Teng et al. 2019, their Fig. 8: at every iteration a worker asks the server,
  which answers "local step" or "distributed step"). No worker waits for another: a member whose
  round has not been uploaded yet steps on and pulls at a later report, and a newer round of the
  same scope (group or global) that has arrived supersedes the older ones it missed (one never
  uploaded is then cancelled, so the evaluated leader never goes back to an older election).

Every message is a header of ``HEADER_WORDS`` int64 (``replicas.HEADER_BYTES``), then a body of
parameters when the header says so:

    worker -> coordinator   [kind, worker, local steps so far, body bytes, loss (float64 bits), round]
    coordinator -> worker   [kind, stop, checkpoint step, body bytes, round, group (-1: global)]

The coordinator takes whichever message arrives first through the parameter server's inbox (one
receiving thread per worker, ``ps.Inbox``); a worker that dies ends only its own thread. Its rounds
are cancelled (a leader lost before uploading) or go on without it, and the survivors carry on.
One ``step`` of the run loop is n reports, as in the simulator. Bytes count every header and body
the coordinator received or sent.

Checkpoints are a quiescent snapshot. After step K the coordinator stops processing: it holds
each live worker's next message unanswered, so every worker waits; then it saves its own state with
the held messages, answers each holder SAVE K, and each worker saves its state (its replica, data
position, step count) as it stands, waiting for the answer to its held message; it acknowledges
(ACK), and once every holder has, ``latest`` moves to K and the held messages are processed as if
just arrived. A resumed coordinator processes the saved held messages first, and a resumed worker
starts by waiting for their answers, so the run continues from one consistent cut. A worker that
has not reported within half the timeout is left out of the cut, and the step folder keeps a file
for exactly the workers of the cut (an earlier attempt's files are removed before the save). A
worker with no state in the checkpoint (lost before it, or left out) says HELLO and is answered
JOIN with the parameters evaluation uses (the center, or the last global leader's): it restarts
from those with fresh momentum. A send to a worker that has died marks it lost; the run goes on.
"""

from __future__ import annotations

import collections
import datetime
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gradwire.algorithms.replicas import HEADER_BYTES, HEADER_WORDS, mean_of
from gradwire.errors import CommunicationError
from gradwire.run.ps import Inbox, _wait

HEAD_TAG, BODY_TAG, REPLY_TAG, REPLY_BODY_TAG, RELEASE_TAG = 21, 22, 23, 24, 25
REPORT, LEAD, BYE, ACK, HELLO = 1, 2, 3, 4, 5     # worker -> coordinator
GO, UPLOAD, PULL, ELASTIC, SAVE, JOIN = 1, 2, 3, 4, 5, 6  # coordinator -> worker
WORKER_KINDS, REPLY_KINDS = {REPORT, LEAD, BYE, ACK, HELLO}, {GO, UPLOAD, PULL, ELASTIC, SAVE, JOIN}


def _receive_framed(model_bytes: int):
    """A receiver for ``Inbox``: a header, then the body it announces."""
    def receive(w: int, timeout_s: float):
        timeout = datetime.timedelta(seconds=timeout_s)
        head = torch.empty(HEADER_WORDS, dtype=torch.int64)
        dist.irecv(head, src=w + 1, tag=HEAD_TAG).wait(timeout=timeout)
        kind, nbytes = int(head[0]), int(head[3])
        if kind not in WORKER_KINDS or int(head[1]) != w or nbytes not in (0, model_bytes):
            raise RuntimeError(f"malformed message from worker {w}: header {head.tolist()}")
        body = None
        if nbytes:
            body = torch.empty(nbytes, dtype=torch.uint8)
            dist.irecv(body, src=w + 1, tag=BODY_TAG).wait(timeout=timeout)
        return (head, body), kind == BYE
    return receive


class Coordinator:
    """Runs on process 0; ``step()`` is one step of the algorithm as the run loop sees it."""

    def __init__(self, run):
        self.run, self.algo = run, run.algorithm
        self.n = run.cfg.workers
        self.timeout_s = run.cfg.timeout_s
        self.is_lsgd = self.algo.name == "lsgd"
        like = self.algo.eval_params()
        self.dtype, self.model_bytes = like.dtype, like.numel() * like.element_size()
        self.local_steps = {w: 0 for w in range(self.n)}
        self.in_flight: dict[int, tuple] = {}  # worker -> (sends, buffers) of our last answer to it
        # async LSGD: rounds whose parameters some live member still has to receive
        self.open: dict[int, object] = {}                # round id -> Round
        self.uploaded: dict[int, torch.Tensor] = {}      # round id -> the leader's parameters
        self.pending = {w: collections.deque() for w in range(self.n)}  # each worker's rounds, in order
        self.lost: dict[int, str] = {}
        self.said_bye: set[int] = set()
        self.finished = False
        self.late_uploads = 0  # leaders' parameters that arrived after the last step
        self.replay: collections.deque = collections.deque()  # messages held over a checkpoint
        self.orphans: list = []  # sends to workers since lost: their buffers must outlive them
        self.refused_bytes = 0  # answers gloo refused to send (their worker had died)
        self.newest_uploaded: dict = {}  # scope (group, None: global) -> newest round whose parameters came
        self.triggered = {"global": 0, "group": 0}
        self.info: dict = {}
        self.inbox = Inbox(self.n, _receive_framed(self.model_bytes), self.timeout_s)

    # -- messages -------------------------------------------------------------------------------------

    def _receive(self, what: str, deadline: float | None = None):
        """The next message from any worker, as (kind, worker, header, body); losses are handled."""
        start = time.perf_counter()
        got = self.inbox.next_message(deadline or start + self.timeout_s, self._lose_reported)
        if got is None:
            alive = self.n - len(self.lost)
            raise CommunicationError(f"coordinator: no report arrived for {what} within {self.timeout_s:g} s "
                                     f"({alive} of {self.n} workers alive)")
        worker, (head, body) = got
        self.run.transport.comm_time_s += time.perf_counter() - start
        self.run.transport.bytes_sent += HEADER_BYTES + (0 if body is None else body.numel())
        previous = self.in_flight.pop(worker, None)
        if previous is not None:  # the worker sent again, so it has received our last answer
            for work in previous[0]:
                _wait(work, self.timeout_s, f"coordinator: answer to worker {worker}")
        return int(head[0]), worker, head, body

    def _lose_reported(self, worker: int, reason: str) -> None:
        """The inbox found a worker gone; with none left there is nothing to wait for."""
        self._lose(worker, reason)
        if len(self.lost) == self.n and not self.finished:
            reasons = "; ".join(f"worker {w}: {r}" for w, r in sorted(self.lost.items()))
            raise CommunicationError(f"coordinator: every worker was lost ({reasons})")

    def _next(self, what: str, deadline: float | None = None):
        """Messages held over a checkpoint first (their bytes were counted when they arrived)."""
        while self.replay:
            w, head, body = self.replay.popleft()
            if w not in self.lost:
                return int(head[0]), w, head, body
        return self._receive(what, deadline)

    def _answer(self, w: int, kind: int, *, body: torch.Tensor | None = None, round_id: int = 0,
                group: int | None = None, checkpoint_step: int = 0) -> None:
        payload = None if body is None else body.reshape(-1).view(torch.uint8)
        nbytes = 0 if payload is None else payload.numel()
        head = torch.tensor([kind, int(self.finished), checkpoint_step, nbytes, round_id,
                             -1 if group is None else group], dtype=torch.int64)
        works = []
        try:  # gloo refuses a send to a peer that has gone at once: the worker is lost
            works.append(dist.isend(head, dst=w + 1, tag=REPLY_TAG))
            if payload is not None:
                works.append(dist.isend(payload, dst=w + 1, tag=REPLY_BODY_TAG))
        except RuntimeError as e:
            self.orphans.append((works, (head, payload)))
            self.refused_bytes += HEADER_BYTES + nbytes  # never crossed the wire: not in bytes_sent
            self._lose(w, str(e).splitlines()[0][:160])
            return
        self.in_flight[w] = (works, (head, payload))  # the buffers live until the sends complete
        self.run.transport.bytes_sent += HEADER_BYTES + nbytes
        if kind == PULL:
            self.info["pulls"] = self.info.get("pulls", 0) + 1

    # -- async LSGD rounds ----------------------------------------------------------------------------

    def _open_round(self, rd) -> None:
        self.open[rd.id] = rd
        self.triggered["global" if rd.group is None else "group"] += 1
        for m in rd.members:
            if m not in self.lost:
                self.pending[m].append(rd.id)

    def _close_if_done(self, rid: int) -> None:
        """Forget a round once its parameters have arrived and no member still has to receive them."""
        if rid in self.open and rid in self.uploaded and not any(rid in self.pending[m]
                                                                 for m in self.open[rid].members):
            del self.open[rid], self.uploaded[rid]

    def _cancel(self, rid: int, why: str) -> None:
        """Drop a round whose parameters were never sent (its leader was lost, or a newer round of
        its scope has been uploaded first): its members carry on without it."""
        self.info[why] = self.info.get(why, 0) + 1
        for m in self.open[rid].members:
            if rid in self.pending[m]:
                self.pending[m].remove(rid)
        del self.open[rid]
        self.uploaded.pop(rid, None)

    def _superseded(self, rid: int) -> bool:
        return rid < self.newest_uploaded.get(self.open[rid].group, 0)

    def _serve(self, w: int) -> None:
        """Answer worker w. Rounds older than the newest uploaded round of their scope are dropped
        first (their pulls would be undone by the newer one); then a round w leads and has not
        uploaded (the other members' pulls need it); otherwise the oldest round whose parameters
        are here; otherwise GO. No worker ever waits for another: a round not uploaded yet is
        served at a later report."""
        pending = self.pending[w]
        if self.finished or not pending:
            self._answer(w, GO)
            return
        for rid in list(pending):
            if rid in pending and self._superseded(rid):
                if self.open[rid].leader == w and rid not in self.uploaded:
                    self._cancel(rid, "superseded")
                else:
                    pending.remove(rid)
                    self.info["superseded"] = self.info.get("superseded", 0) + 1
                    self._close_if_done(rid)
        for rid in pending:
            rd = self.open[rid]
            if rd.leader == w and rid not in self.uploaded:
                pending.remove(rid)
                self._answer(w, UPLOAD, round_id=rid, group=rd.group)
                return
        ready = [rid for rid in pending if rid in self.uploaded]
        if not ready:
            self._answer(w, GO)
            return
        rid = ready[0]
        pending.remove(rid)
        rd = self.open[rid]
        self._answer(w, PULL, body=self.uploaded[rid], round_id=rid, group=rd.group)
        self._close_if_done(rid)

    def _lead(self, w: int, head: torch.Tensor, body: torch.Tensor) -> None:
        rid = int(head[5])
        rd = self.open.get(rid)
        if rd is None:  # cancelled meanwhile: a newer round of its scope came first
            self.info["uploads_superseded"] = self.info.get("uploads_superseded", 0) + 1
            return
        if rd.leader != w or rid in self.uploaded:
            raise CommunicationError(f"coordinator: worker {w} uploaded parameters for round {rid}, "
                                     "which it does not lead")
        if self._superseded(rid):
            self.info["uploads_superseded"] = self.info.get("uploads_superseded", 0) + 1
            self._cancel(rid, "superseded")
            return
        lead = body.view(self.dtype).clone()
        self.uploaded[rid] = lead
        self.newest_uploaded[rd.group] = rid
        self.algo.round_ended(rd, lead, self.info)
        self._close_if_done(rid)

    def _lose(self, w: int, reason: str) -> None:
        if w in self.lost:
            return
        self.lost[w] = reason
        if w in self.in_flight:
            self.orphans.append(self.in_flight.pop(w))
        self.pending[w].clear()
        if not self.is_lsgd:
            return
        self.algo.rounds.lost.add(w)
        for rid in list(self.open):
            if self.open[rid].leader == w and rid not in self.uploaded:
                self._cancel(rid, "cancelled_rounds")
            else:
                self._close_if_done(rid)

    # -- the run loop's view --------------------------------------------------------------------------

    def _report(self, w: int, head: torch.Tensor, body: torch.Tensor | None, loss: float) -> None:
        self.local_steps[w] = int(head[2])
        if self.is_lsgd:
            if not self.finished:
                for rd in self.algo.rounds.completed(w, loss):
                    self._open_round(rd)
            self._serve(w)
        elif body is not None:  # an EASGD exchange, answered even after the last step
            elastic = self.algo.elastic_at_center(body.view(self.dtype))
            alpha = self.algo.alpha
            self.info.setdefault("distances", []).append(float(elastic.norm()) / alpha if alpha else 0.0)
            self.info["exchanges"] = self.info.get("exchanges", 0) + 1
            self._answer(w, ELASTIC, body=elastic)
        else:
            self._answer(w, GO)

    def _hello(self, w: int) -> None:
        """A worker with no state in the checkpoint rejoins: the parameters evaluation uses."""
        self.lost.pop(w, None)
        if self.is_lsgd:
            self.algo.rounds.lost.discard(w)
        # a copy: the center or leader may change before the send has gone out
        self._answer(w, JOIN, body=self.algo.eval_params().clone(), round_id=self.local_steps[w])

    def step(self, step: int) -> dict:
        self.info = {"exchanges": 0} if not self.is_lsgd else {}
        losses = []
        while len(losses) < self.n:
            kind, w, head, body = self._next(f"step {step} ({len(losses)} of {self.n} reports so far)")
            if kind == REPORT:
                loss = float(head[4:5].view(torch.float64))
                losses.append(loss)
                self._report(w, head, body, loss)  # every answer after the last step says stop
            elif kind == LEAD:
                self._lead(w, head, body)
                self._serve(w)
            elif kind == HELLO:
                self._hello(w)
            else:
                raise CommunicationError(f"coordinator: unexpected message {kind} from worker {w} at step {step}")
        info = self.info | {"loss": mean_of(losses), "gradients": len(losses)}
        if "distances" in info:
            info["center_distance"] = mean_of(info.pop("distances"))
        if self.is_lsgd:
            info["leader"] = self.algo.leader
            if self.algo.multi:
                info["group_leaders"] = list(self.algo.group_leaders)
        return info

    # -- checkpoints ----------------------------------------------------------------------------------

    def checkpoint(self, folder, step: int) -> None:
        """The quiescent cut described in the module docstring. A worker that has not reported
        within half the timeout is left out of the cut (it rejoins with HELLO after a resume);
        whatever was held is processed afterwards even if the checkpoint fails."""
        from gradwire.run import checkpoint

        held, later, holders = [], [], set()
        try:
            deadline = time.perf_counter() + self.timeout_s / 2
            while not set(range(self.n)) - set(self.lost) <= holders:
                try:
                    kind, w, head, body = self._next(f"the checkpoint of step {step}", deadline)
                except CommunicationError:
                    break
                if kind == HELLO:
                    self._hello(w)
                    continue
                held.append((w, head, body))
                holders.add(w)
            cut = holders - set(self.lost)
            held[:] = [m for m in held if m[0] in cut]
            stepdir = Path(folder) / f"step-{step:08d}"
            for stale in stepdir.glob("rank*.pt"):  # an earlier attempt's: only this cut may be there
                if stale.name != f"{self.run.label}.pt":
                    stale.unlink()
            state = self.run.state_dict() | {"coord": self.state_dict(held)}
            # the SAVE answers and ACKs about to cross the wire belong to the count a resume starts from
            state["transport"] = state["transport"] | {"bytes_sent": state["transport"]["bytes_sent"]
                                                       + 2 * HEADER_BYTES * len(cut)}
            checkpoint.save(folder, step, self.run.label, state, self.run.cfg.to_dict(), coordinator=False)
            for w in sorted(cut):
                self._answer(w, SAVE, checkpoint_step=step)
            acked: set[int] = set()
            while not cut - set(self.lost) <= acked:
                kind, w, head, body = self._receive(f"the acknowledgements of checkpoint {step}")
                if kind == ACK and w in cut:
                    acked.add(w)
                else:  # from a worker outside the cut: processed after the held messages
                    later.append((w, head, body))
            checkpoint.mark_latest(folder, step)
        finally:
            self.replay.extend(held + later)

    def state_dict(self, held: list) -> dict:
        def round_state(rd):
            return {"group": -1 if rd.group is None else rd.group, "members": list(rd.members), "leader": rd.leader,
                    "score": rd.score, "weight": rd.weight}
        return {"local_steps": {str(w): n for w, n in self.local_steps.items()},
                "open": {str(rid): round_state(rd) for rid, rd in self.open.items()},
                "uploaded": {str(rid): t for rid, t in self.uploaded.items()},
                "pending": {str(w): list(q) for w, q in self.pending.items()},
                "newest_uploaded": {str(-1 if g is None else g): r for g, r in self.newest_uploaded.items()},
                "triggered": dict(self.triggered),
                "held": [{"worker": w, "head": head,
                          "body": torch.empty(0, dtype=torch.uint8) if body is None else body}
                         for w, head, body in held]}

    def load_state_dict(self, state: dict, stepdir) -> None:
        """``stepdir``: the checkpoint folder; a worker with no state file there will rejoin with
        HELLO, so its held message is dropped (it never sent one, as far as it knows)."""
        from gradwire.algorithms.lsgd import Round

        self.local_steps = {w: int(state["local_steps"][str(w)]) for w in range(self.n)}
        self.open = {int(rid): Round(int(rid), None if r["group"] < 0 else int(r["group"]),
                                     [int(m) for m in r["members"]], int(r["leader"]), float(r["score"]),
                                     float(r["weight"]))
                     for rid, r in state["open"].items()}
        self.uploaded = {int(rid): t.clone() for rid, t in state["uploaded"].items()}
        self.pending = {w: collections.deque(int(i) for i in state["pending"][str(w)]) for w in range(self.n)}
        # the checkpoint holds a file for exactly the workers of its cut; the others rejoin fresh
        missing = {w for w in range(self.n) if not (stepdir / f"rank{w + 1}.pt").exists()}
        self.replay = collections.deque((int(m["worker"]), m["head"].clone(), m["body"].clone() if m["body"].numel()
                                         else None) for m in state["held"] if int(m["worker"]) not in missing)
        self.newest_uploaded = {None if int(g) < 0 else int(g): int(r) for g, r in state["newest_uploaded"].items()}
        self.triggered = {k: int(v) for k, v in state["triggered"].items()}
        for w in missing:
            self.pending[w].clear()
        for rid in list(self.open):
            if self.open[rid].leader in missing and rid not in self.uploaded:
                self._cancel(rid, "cancelled_rounds")

    # -- the end ----------------------------------------------------------------------------------------

    def finish(self) -> dict:
        """Answer every worker with stop (an EASGD exchange still gets its elastic step), hear every
        goodbye, then release them all together; bounded by the timeout."""
        deadline = time.perf_counter() + self.timeout_s
        self.finished = True
        while len(self.said_bye | set(self.lost)) < self.n:
            try:
                kind, w, head, body = self._next("the last messages", deadline)
            except CommunicationError:
                break
            if kind == BYE:
                self.local_steps[w] = int(head[2])
                self.said_bye.add(w)
            elif kind == REPORT:
                self._report(w, head, body, float(head[4:5].view(torch.float64)))
            elif kind == HELLO:
                self._hello(w)
            elif kind == ACK:  # of a checkpoint that failed part-way: nothing to answer
                continue
            else:  # parameters for a round that ends with the run: not passed on
                self.late_uploads += 1
                self._answer(w, GO)
        for w in range(self.n):
            if w not in self.said_bye and w not in self.lost:
                self.lost[w] = "did not finish"
        release = torch.ones(1, dtype=torch.int64)
        works = []
        for w in sorted(self.said_bye):
            try:
                works.append(dist.isend(release, dst=w + 1, tag=RELEASE_TAG))
                self.run.transport.bytes_sent += release.element_size()
            except RuntimeError:  # gone after its goodbye: nothing left to tell it
                pass
        for work in works:
            try:
                _wait(work, 10.0, "")
            except CommunicationError:
                pass
        summary = {"lost_workers": sorted(self.lost), "lost_reasons": {str(k): v for k, v in self.lost.items()},
                   "local_steps": {str(w): n for w, n in self.local_steps.items()},
                   "answers_refused_bytes": self.refused_bytes}
        if self.is_lsgd:
            summary["uploads_after_last_step"] = self.late_uploads
            summary["rounds_triggered"] = dict(self.triggered)
        return summary


def run_worker(run) -> dict:
    """The loop of worker w (process w+1): a local step, a report, the coordinator's answer."""
    (w,) = run.ctx.local_ranks
    algo = run.algorithm
    x = algo.replicas.x[w]
    timeout_s = run.cfg.timeout_s
    what = f"worker {w}: the coordinator did not answer within {timeout_s:g} s"
    incoming = torch.empty(x.numel() * x.element_size(), dtype=torch.uint8)
    is_easgd = algo.name == "easgd"

    def send(kind: int, count: int, loss: float = 0.0, body: torch.Tensor | None = None, round_id: int = 0):
        payload = None if body is None else body.reshape(-1).view(torch.uint8)
        head = torch.tensor([kind, w, count, 0 if payload is None else payload.numel(), 0, round_id],
                            dtype=torch.int64)
        head[4:5].view(torch.float64).fill_(loss)
        sends = [dist.isend(head, dst=0, tag=HEAD_TAG)]
        if payload is not None:
            sends.append(dist.isend(payload, dst=0, tag=BODY_TAG))
        for work in sends:  # completes once the coordinator's inbox has taken it
            _wait(work, timeout_s, f"worker {w}: the coordinator took no message within {timeout_s:g} s")

    def answer() -> torch.Tensor:
        reply = torch.empty(HEADER_WORDS, dtype=torch.int64)
        _wait(dist.irecv(reply, src=0, tag=REPLY_TAG), timeout_s, what)
        if int(reply[0]) not in REPLY_KINDS or int(reply[3]) not in (0, incoming.numel()):
            raise CommunicationError(f"worker {w}: malformed answer from the coordinator: {reply.tolist()}")
        if int(reply[3]):
            _wait(dist.irecv(incoming, src=0, tag=REPLY_BODY_TAG), timeout_s, what)
        return reply

    count, reply = 0, None
    if run.ps_resume is not None:  # saved while its last message waited for an answer: wait for it now
        count = run.ps_resume["count"]
        reply = answer()
    elif run.ps_rejoin:  # no state in the checkpoint: start from the coordinator's parameters
        send(HELLO, 0)
        reply = answer()
    while True:
        if reply is None:
            run.oracle.step = count + 1
            loss = algo.replicas.sgd_step(run.ctx, w)
            count += 1
            send(REPORT, count, loss, x if is_easgd and algo.exchange_due(count) else None)
            run.kill_point(count, phase="sent")
            reply = answer()
        kind, stop = int(reply[0]), bool(int(reply[1]))
        if kind == UPLOAD and not stop:  # lead a round: our parameters, as they are now
            send(LEAD, count, body=x, round_id=int(reply[4]))
            reply = answer()
            continue
        if kind == SAVE:  # a checkpoint: our state as it stands, still waiting for the last answer
            run.save_worker_checkpoint(int(reply[2]), {"count": count})
            send(ACK, count)
            reply = answer()
            continue
        if kind == ELASTIC:
            x.sub_(incoming.view(x.dtype))
        elif kind == PULL:
            x.lerp_(incoming.view(x.dtype), algo.top_pull if int(reply[5]) < 0 else algo.pull)
        elif kind == JOIN:
            x.copy_(incoming.view(x.dtype))
            count = int(reply[4])
        if stop:
            send(BYE, count)
            _wait(dist.irecv(torch.empty(1, dtype=torch.int64), src=0, tag=RELEASE_TAG), timeout_s,
                  f"worker {w}: no release from the coordinator")
            return {"worker": w, "local_steps": count}
        run.kill_point(count)
        reply = None
