"""The real server-mode driver: the protocol over a real backend's point-to-point calls.

Process 0 serves (``RealServer``); process w+1 hosts worker w (``RealWorker``). A worker computes,
sends its message and waits for the answer, which it applies; the server takes the messages in
the order they reach it (``inbox.Inbox``) and runs the algorithm's ``on_message`` on each. So the
simulator (``simulated.py``) and a real backend run the same protocol, and count the same bytes
for the same events. The driver adds its own messages around it:

- stop: after the run's last step every reply carries the STOP flag; the worker applies it, says
  goodbye (BYE), and leaves once the server has heard every goodbye and
  released them all together, so no process leaves the group while another still exchanges;
- loss: a worker that dies or stays silent past the timeout ends only its inbox thread; the
  algorithm is told (``on_lost``: with backups the others still make N per step; a lost leader's
  rounds are cancelled) and the summary names it; a send that gloo refuses marks its worker lost;
- checkpoints, a quiescent cut: after step K the server holds each live worker's next message,
  answers each holder SAVE, and each worker saves its state as it stands, still waiting for the
  answer to its held message, and acknowledges (ACK); then the server saves its own state with
  the held messages, ``latest`` moves to K, and the held messages are handled as if just arrived.
  A cut with a member lost before it is committed is abandoned (``latest`` stays where it was).
  A resumed server handles the saved held messages first, and a resumed worker starts by waiting
  for their answers. A worker that has not sent within half the timeout is left out of the cut;
- rejoin: a worker with no state in the checkpoint says HELLO and is answered with the algorithm's
  ``join_reply`` (the parameters it starts from).

Bytes count every header and body the server received or sent (the transport counts them).
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

import torch

from gradwire import checkpoint
from gradwire.algorithms.protocol import (
    ACK,
    BYE,
    GRADIENT,
    HELLO,
    JOIN,
    REPORT,
    SAVE,
    SERVER_KINDS,
    STOP,
    WORKER_KINDS,
    Message,
)
from gradwire.errors import CommunicationError
from gradwire.report.timeline import COMM, DROPPED, QUEUED, SERVE, WAIT
from gradwire.servers.driver import Driver, DriverParts
from gradwire.servers.inbox import RELEASE_TAG, TO_SERVER, TO_WORKER, Inbox, receive_message, send_message
from gradwire.transports.base import SERVER, PeerLost

COMPUTED = (GRADIENT, REPORT)  # kinds that carry one computed gradient or local step


class NoMessage(CommunicationError):
    """No message reached the server before a deadline; a wait that may end without one (a checkpoint's
    cut, the last goodbyes) catches this, never the wider CommunicationError (every worker lost)."""


class RealServer(Driver):
    """Runs on process 0; ``step()`` is one step of the algorithm as the run loop sees it."""

    def __init__(self, parts: DriverParts):
        super().__init__(parts)
        self.clock = parts.clock
        self.n = parts.ctx.world_size
        self.timeout_s = parts.timeout_s
        self.in_flight: dict[int, tuple] = {}  # worker -> the sends of our last reply to it
        self.lost: dict[int, str] = {}
        # every worker lost in this run, also before the checkpoint it resumed from and those that
        # rejoined since (``lost`` forgets a worker when it rejoins): what the summary names
        self.lost_in_run: dict[int, str] = {}
        self.rejoined: set[int] = set()  # workers that said HELLO in this run (resumed with no state of their own)
        self.said_bye: set[int] = set()
        self.finished = False
        self.received = {w: 0 for w in range(self.n)}    # computations taken from each worker
        self.counts = {w: 0 for w in range(self.n)}      # each worker's count, as it last said
        self.replay: collections.deque[Message] = collections.deque()  # held over a checkpoint
        self.orphans: list = []  # sends to workers since lost: their buffers must outlive them
        self.refused_bytes = 0   # replies the transport refused (their worker had died): never sent
        self.inbox = Inbox(self.transport, self.n, self.timeout_s, WORKER_KINDS, BYE)
        self.arrived = 0.0  # when the message being handled reached the server (the run's clock)

    # -- messages -------------------------------------------------------------------------------------

    def _receive(self, what: str, deadline: float | None = None, done=None) -> Message | None:
        """The next message (held ones first); raises NoMessage past the deadline. With
        ``done``, a wait that a loss has made pointless (``done()`` holds after it) returns None."""
        while self.replay:
            msg = self.replay.popleft()
            if msg.worker not in self.lost:
                self.arrived = self.clock.now  # held over a checkpoint: its wait is not on the timeline
                return msg
        start = time.perf_counter()
        got = self.inbox.next_message(deadline or start + self.timeout_s, self._lose, done)
        if got is None and done is not None and done():
            return None
        if got is None:
            alive = self.n - len(self.lost)
            raise NoMessage(f"server: no message arrived for {what} within {self.timeout_s:g} s "
                                     f"({alive} of {self.n} workers alive)")
        self.transport.count(got.nbytes, time.perf_counter() - start)  # the inbox received it ahead
        self.arrived = self.clock.now - (time.perf_counter() - self.inbox.last_arrival)
        previous = self.in_flight.pop(got.worker, None)
        if previous is not None:  # the worker sent again, so it has received our last reply
            for sent in previous:
                sent.wait(self.timeout_s)
        return got

    def _lose(self, w: int, reason: str) -> None:
        if w in self.lost:
            return
        self.lost[w] = reason
        self.lost_in_run.setdefault(w, reason)
        if w in self.in_flight:
            self.orphans.append(self.in_flight.pop(w))
        self.algo.on_lost(w)
        if self.finished:
            return
        reasons = "; ".join(f"worker {k}: {r}" for k, r in sorted(self.lost.items()))
        if len(self.lost) == self.n:
            raise CommunicationError(f"server: every worker was lost ({reasons})")
        need = self.algo.workers_needed()
        if self.n - len(self.lost) < need:
            raise CommunicationError(f"server: {len(self.lost)} of {self.n} workers lost ({reasons}); a step of "
                                     f"{self.algo.name} needs {need} workers' messages, so it cannot go on (with b "
                                     f"backups a run survives b losses)")

    def _reply(self, msg: Message) -> None:
        if self.finished:
            msg.flags |= STOP
        try:
            self.in_flight[msg.worker] = send_message(self.transport, msg, SERVER, msg.worker, TO_WORKER)
        except PeerLost as e:  # gloo refuses a send to a peer that has gone at once
            self.refused_bytes += msg.nbytes - e.sent_bytes
            self._lose(msg.worker, str(e))

    def _handle(self, msg: Message) -> dict | None:
        """One message; returns the step's figures when it completed a step."""
        w = msg.worker
        if msg.kind == HELLO:  # a worker with no state in the checkpoint rejoins
            self.lost.pop(w, None)
            self.rejoined.add(w)
            join = self.algo.join_reply(w)
            join.count = self.counts[w]  # its count as of the cut it resumes from: it goes on from there
            self._reply(join)
            return None
        if msg.kind == BYE:
            self.said_bye.add(w)
            self.counts[w] = msg.count
            return None
        if msg.kind == ACK:  # of a checkpoint that failed part-way: nothing to answer
            return None
        if msg.kind in COMPUTED:
            self.received[w] += 1
            self.counts[w] = msg.count
        began = self.clock.now
        answer = self.algo.on_message(msg, self.finished)
        for reply in answer.replies:
            self._reply(reply)
        timeline = self.ctx.timeline
        timeline.add(w, QUEUED, self.arrived, began, step=msg.count)
        timeline.add(w, SERVE, began, self.clock.now, step=msg.count, value=answer.staleness,
                          flags=DROPPED if answer.dropped else 0)
        if answer.step is not None:
            timeline.flush()
        return answer.step

    def step(self, step: int) -> dict:
        while True:
            info = self._handle(self._receive(f"step {step}"))
            if info is not None:
                return info

    def before_evaluation(self) -> None:
        """Nothing: the server holds the parameters evaluated, and the workers are not at a step
        boundary to gather anything or agree on counters."""

    # -- checkpoints ----------------------------------------------------------------------------------

    def save_checkpoint(self, step: int) -> None:
        """The quiescent cut of the module docstring; whatever was held is handled afterwards, even
        if the checkpoint fails."""
        held: list[Message] = []
        try:
            deadline = time.perf_counter() + self.timeout_s / 2
            holders: set[int] = set()
            def everyone_holds() -> bool:
                return not set(range(self.n)) - set(self.lost) - holders

            while not everyone_holds():
                try:
                    msg = self._receive(f"the checkpoint of step {step}", deadline, everyone_holds)
                except NoMessage:  # the deadline: the cut is who holds now
                    break
                if msg is None:
                    break
                if msg.kind == HELLO:
                    self._handle(msg)
                    continue
                held.append(msg)
                holders.add(msg.worker)
            cut = holders - set(self.lost)
            self.parts.checkpoints.clear_parts(step)  # an earlier attempt's: only this cut may be there
            for w in sorted(cut):
                self._reply(Message(SAVE, w, checkpoint=step))
            acked: set[int] = set()

            def everyone_acked() -> bool:
                return not cut - set(self.lost) - acked

            while not everyone_acked():
                msg = self._receive(f"the acknowledgements of checkpoint {step}", done=everyone_acked)
                if msg is None:
                    break
                if msg.kind == ACK and msg.worker in cut:
                    acked.add(msg.worker)
                else:  # from a worker outside the cut: handled after the held messages
                    held.append(msg)
            gone = sorted((cut - acked) | (cut & set(self.lost)))
            if gone:
                # a member died after its SAVE (before or after its ACK): its state file may not be
                # whole, and the algorithm has already forgotten it (on_lost); committing would resume
                # it as lost with its own state present. The cut is abandoned; ``latest`` stays.
                print(f"gradwire: checkpoint of step {step} not committed: worker(s) "
                      f"{', '.join(map(str, gone))} lost before the cut was complete", file=sys.stderr, flush=True)
                return
            self.parts.checkpoints.save(step, {"server": self._cut_state(held)}, part_of_cut=True)
            self.parts.checkpoints.mark_latest(step)
        finally:
            self.replay.extend(held)

    def _cut_state(self, held: list[Message]) -> dict:
        """The server's entry in its checkpoint: taken only at a cut, with the messages it held."""
        return {"held": [m.state_dict() for m in held],
                "received": {str(w): n for w, n in self.received.items()},
                "counts": {str(w): n for w, n in self.counts.items()},
                "lost": {str(w): why for w, why in self.lost_in_run.items()},
                "rejoined": sorted(self.rejoined), "refused_bytes": self.refused_bytes}

    def load_state_dict(self, state: dict, stepdir: Path | None = None) -> None:
        """A worker with no state file in ``stepdir`` will rejoin with HELLO: its held message is
        dropped (as far as it knows, it never sent one) and the algorithm forgets it until then."""
        state = checkpoint.floats_to(state["server"], self.ctx.device)
        missing = set() if stepdir is None else \
            {w for w in range(self.n) if not (Path(stepdir) / f"rank{w + 1}.pt").exists()}
        self.replay = collections.deque(m for m in (Message.from_state(s) for s in state["held"])
                                        if m.worker not in missing)
        self.received = {w: int(state["received"][str(w)]) for w in range(self.n)}
        self.counts = {w: int(state["counts"][str(w)]) for w in range(self.n)}
        self.lost_in_run = {int(w): str(why) for w, why in state.get("lost", {}).items()}  # older: none kept
        self.rejoined = {int(w) for w in state.get("rejoined", [])}
        self.refused_bytes = int(state.get("refused_bytes", 0))  # older checkpoints: none kept
        for w in sorted(missing):
            self.algo.on_lost(w)

    # -- the end --------------------------------------------------------------------------------------

    def finish(self) -> dict:
        """Answer every worker with STOP, hear every goodbye, then release them all together;
        bounded by the timeout (a worker that never answers is lost)."""
        deadline = time.perf_counter() + self.timeout_s
        self.finished = True
        def everyone_left() -> bool:
            return len(self.said_bye | set(self.lost)) >= self.n

        while not everyone_left():
            try:
                msg = self._receive("the last messages", deadline, everyone_left)
            except NoMessage:
                break
            if msg is None:
                break
            self._handle(msg)
        for w in range(self.n):
            if w not in self.said_bye and w not in self.lost:
                self.lost[w] = "did not finish"
        release = torch.ones(1, dtype=torch.int64).view(torch.uint8)
        sends = []
        for w in sorted(self.said_bye):
            try:
                sends.append(self.transport.send(release, SERVER, w, tag=RELEASE_TAG))
            except PeerLost:  # gone after its goodbye: nothing left to tell it
                pass
        for sent in sends:
            try:
                sent.wait(10.0)
            except PeerLost:
                pass
        lost = self.lost_in_run | self.lost
        return {"lost_workers": sorted(lost), "lost_reasons": {str(k): v for k, v in sorted(lost.items())},
                "rejoined_workers": sorted(self.rejoined),
                "gradients_received": {str(w): n for w, n in self.received.items()},
                "local_steps": {str(w): n for w, n in self.counts.items()},
                "answers_refused_bytes": self.refused_bytes} | self.algo.server_summary()


class RealWorker(Driver):
    """Process w+1, hosting worker w: its own loop (compute, send, wait for the answer, apply it)
    until the server says stop; it has no step of the run's, so no run loop, folder or evaluation."""

    def __init__(self, parts: DriverParts):
        super().__init__(parts)
        (self.w,) = parts.ctx.local_ranks
        self.count = 0            # the worker's computations so far
        self.resume_count = None  # resumed: the count its checkpoint was saved at, the answer awaited
        self.rejoin = False       # ... or no state of its own in the checkpoint: it rejoins

    # -- its messages -------------------------------------------------------------------------------

    def _send(self, msg: Message) -> None:
        w, timeout_s, clock = self.w, self.parts.timeout_s, self.parts.clock
        began = clock.now
        try:
            for sent in send_message(self.transport, msg, w, SERVER, TO_SERVER):
                sent.wait(timeout_s)  # completes once the server's inbox has taken it
        except PeerLost as e:
            raise CommunicationError(f"worker {w}: the server took no message within {timeout_s:g} s ({e})") from None
        self.ctx.timeline.add(w, COMM, began, clock.now, nbytes=msg.nbytes)

    def _answer(self) -> Message:
        w, timeout_s, clock = self.w, self.parts.timeout_s, self.parts.clock
        began = clock.now
        try:
            reply = receive_message(self.transport, SERVER, w, TO_WORKER, timeout_s, SERVER_KINDS)
        except PeerLost as e:
            raise CommunicationError(f"worker {w}: the server did not answer within {timeout_s:g} s ({e})") from None
        if reply.worker != w:
            raise CommunicationError(f"worker {w}: an answer addressed to worker {reply.worker}")
        self.ctx.timeline.add(w, WAIT, began, clock.now, nbytes=reply.nbytes)  # for the server, the transfer included
        self.ctx.timeline.flush()
        return reply

    def _settle(self, reply: Message) -> bool:
        """Handle the server's answers until the worker may compute again; True once told to stop
        (after its goodbye and the server's release)."""
        w = self.w
        while True:
            if reply.kind == SAVE:  # a checkpoint: our state as it stands, still waiting for the last answer
                self.parts.checkpoints.save(reply.checkpoint, {"step": reply.checkpoint,
                                                               "worker_position": {"count": self.count}},
                                            part_of_cut=True)
                self.parts.fault_point(reply.checkpoint, "saved")
                self._send(Message(ACK, w, count=self.count))
                reply = self._answer()
                continue
            if reply.kind == JOIN:
                self.count = reply.count
            follow = self.algo.worker_apply(self.ctx, w, reply)
            if follow is not None and not reply.stop:
                follow.count = self.count
                self._send(follow)
                reply = self._answer()
                continue
            if reply.stop:
                self._send(Message(BYE, w, count=self.count))
                try:
                    self.transport.recv(8, SERVER, w, tag=RELEASE_TAG, timeout_s=self.parts.timeout_s)
                except PeerLost as e:
                    raise CommunicationError(f"worker {w}: no release from the server ({e})") from None
                return True
            self.parts.fault_point(self.count, "step")
            return False

    # -- the driver ---------------------------------------------------------------------------------

    def step(self, step: int) -> dict:
        """The worker's computation ``step`` (its count): sent, and the answers settled."""
        self.count = step
        self.ctx.oracle.step = self.ctx.timeline.step = step
        self._send(self.algo.worker_step(self.ctx, self.w, step))
        self.parts.fault_point(step, "sent")
        return {"stop": self._settle(self._answer())}

    def train(self, loop) -> dict:
        """The worker's loop instead of the run's; it closes what the run opened for it."""
        try:
            stop = False
            if self.resume_count is not None:  # saved while its last message waited for an answer: wait for it now
                self.count = self.resume_count
                stop = self._settle(self._answer())
            elif self.rejoin:  # no state in the checkpoint: start from what the server gives
                self._send(Message(HELLO, self.w))
                stop = self._settle(self._answer())
            while not stop:
                stop = self.step(self.count + 1)["stop"]
            return {"worker": self.w, "local_steps": self.count}
        finally:
            self.algo.close()
            self.ctx.timeline.close()
            self.transport.close()

    def takes_state_from(self, stepdir: Path, label: str) -> bool:
        """A worker lost before the checkpoint in ``stepdir`` was taken has no part in it: it
        rejoins with fresh state, from the server's parameters."""
        self.rejoin = not (Path(stepdir) / f"{label}.pt").exists()
        return not self.rejoin

    def load_state_dict(self, state: dict, stepdir: Path | None = None) -> None:
        if "worker_position" in state:  # saved at a cut: where it stood
            self.resume_count = int(state["worker_position"]["count"])
