"""Parameter-server mode of the torch backend: backup workers and asynchronous SGD for real.

Process 0 is the server and processes 1..N+b host workers 0..N+b-1. Every message is one
fixed-size uint8 buffer. The server takes whichever arrives first through an inbox fed by one
receiving thread per worker (a blocking receive from that worker): gloo's receive from any
source fails outright once any peer has died, and gloo's ``is_completed`` does not advance without
``wait``, so neither polling nor any-source receives can survive a lost worker. A dead peer ends
only its own thread, which reports the worker lost. Messages:

    worker -> server   [tag, payload bytes, loss (float64 bits), worker, gradient count] + payload
    server -> worker   [tag, stop flag, checkpoint step or 0] + the parameters

``tag`` is the step a gradient was computed for (sync with backups) or the parameter version it
was computed at (async). Sync with backups (Chen et al. 2016): the server collects gradients for
step t until N have arrived, applies their mean and sends x_{t+1} to every worker that waits for
it. A gradient that arrives for an earlier step is late: it is counted in ``dropped``, never
applied, and its worker gets the current parameters at once, so a straggler skips ahead instead
of replaying the steps it missed. Each worker thus has at most one reply in flight. Async: each
arrival is applied (or dropped as too stale) and answered at once. The arithmetic is the
algorithm's own (``SyncSGD.aggregate``, ``opt.apply``, ``AsyncSGD.server_apply``), the code the
simulator runs. A worker that dies stops arriving; with backups the others still make N per step
and the summary names the workers lost. Bytes count every message the server received or sent.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time

import torch
import torch.distributed as dist

from gradwire.errors import CommunicationError, ConfigError

HEADER, REPLY = 5, 3  # int64 words
GRAD_TAG, REPLY_TAG, RELEASE_TAG = 1, 2, 4
BYE = -2  # the tag of a worker's last message
HELLO = -3  # a worker with no state in the checkpoint asks for the current parameters


class Inbox:
    """One thread per worker receives that worker's messages in order and queues them; a worker
    that says goodbye, dies, or stays silent past the timeout ends its thread. ``receive(w,
    timeout_s)`` takes one message from worker w (raising RuntimeError as gloo does) and returns
    it with whether it was the worker's last."""

    def __init__(self, n_workers: int, receive, timeout_s: float):
        self.events: queue.Queue = queue.Queue()
        self.threads = [threading.Thread(target=self._listen, args=(w, receive, timeout_s), daemon=True,
                                         name=f"gradwire-inbox-{w}") for w in range(n_workers)]
        for t in self.threads:
            t.start()

    def _listen(self, w: int, receive, timeout_s: float) -> None:
        while True:
            try:
                message, last = receive(w, timeout_s)
            except RuntimeError as e:
                self.events.put(("lost", w, str(e).splitlines()[0][:160]))
                return
            self.events.put(("msg", w, message))
            if last:
                return

    def next_message(self, deadline: float, on_lost):
        """The next message in arrival order as (worker, message), or None once ``deadline``
        (``time.perf_counter``) has passed; a loss met on the way goes to ``on_lost(worker, reason)``."""
        while True:
            try:
                kind, worker, data = self.events.get(timeout=max(0.05, deadline - time.perf_counter()))
            except queue.Empty:
                return None
            if kind == "lost":
                on_lost(worker, data)
                continue
            return worker, data


def _receive_fixed(msg_bytes: int):
    """A receiver for ``Inbox``: one fixed-size message, tagged like a gradient."""
    def receive(w: int, timeout_s: float):
        buf = torch.empty(msg_bytes, dtype=torch.uint8)
        dist.irecv(buf, src=w + 1, tag=GRAD_TAG).wait(timeout=datetime.timedelta(seconds=timeout_s))
        return buf, int(buf[:8].view(torch.int64)) == BYE
    return receive


def _payload_size(algo, x: torch.Tensor) -> int:
    size = algo.codec.compressor.nbytes(x.numel(), x.dtype)
    if size is None:
        raise ConfigError(f"the parameter-server mode needs a fixed-size compressor; "
                          f"{algo.codec.compressor.spec()} sends a data-dependent number of bytes")
    return size


def _wait(work, seconds: float, what: str) -> None:
    try:
        work.wait(timeout=datetime.timedelta(seconds=max(0.05, seconds)))
    except RuntimeError as e:
        raise CommunicationError(f"{what} ({str(e).splitlines()[0][:160]})") from None


class PSServer:
    """Runs on process 0; ``step()`` is one step of the algorithm as the run loop sees it."""

    def __init__(self, run):
        self.run, self.algo = run, run.algorithm
        self.n_workers = run.cfg.workers
        self.timeout_s = run.cfg.timeout_s
        x = self.algo.x
        self.payload = _payload_size(self.algo, x)
        self.msg_bytes = HEADER * 8 + self.payload
        self.reply_bytes = REPLY * 8 + x.numel() * x.element_size()
        self.in_flight: dict[int, tuple] = {}  # worker -> (send work, buffer) of its last reply
        self.awaiting: list[int] = []           # workers whose gradient counted and who wait for x_{t+1}
        self.stopped: set[int] = set()
        self.said_bye: set[int] = set()
        self.received = {w: 0 for w in range(self.n_workers)}  # gradients taken from each worker
        self.lost: dict[int, str] = {}
        self.is_async = self.algo.name == "async"
        self.inbox = Inbox(self.n_workers, _receive_fixed(self.msg_bytes), self.timeout_s)
        # Checkpoints: after step K the server saves its state and flags its next reply to each
        # worker, who then saves its own; a worker's next message acknowledges, and `latest`
        # moves to K once every live worker has.
        self.ckpt_step, self.ckpt_unflagged, self.ckpt_unacked = 0, set(), set()
        self.checkpoint_after, self.deferred = 0, []
        self.current_step, self.finished = run.step + 1, False

    def _receive(self, what: str, deadline: float | None = None):
        """The next message from any worker in arrival order: a gradient as (worker, tag, loss,
        count, payload), or None for a goodbye; losses are noted."""
        start = time.perf_counter()
        got = self.inbox.next_message(deadline or start + self.timeout_s, self._lose)
        if got is None:
            alive = self.n_workers - len(self.lost)
            raise CommunicationError(f"parameter server: no gradient arrived for {what} within "
                                     f"{self.timeout_s:g} s ({alive} of {self.n_workers} workers alive)")
        worker, data = got
        self.run.transport.comm_time_s += time.perf_counter() - start
        self.run.transport.bytes_sent += self.msg_bytes
        head = data[: HEADER * 8].view(torch.int64)
        tag, nbytes, count = int(head[0]), int(head[1]), int(head[4])
        if int(head[3]) != worker or (tag != BYE and nbytes != self.payload):
            raise CommunicationError(f"parameter server: malformed message from worker {worker}")
        previous = self.in_flight.pop(worker, None)
        if previous is not None:  # the worker sent again, so it has received our last reply
            _wait(previous[0], self.timeout_s, f"parameter server: reply to worker {worker}")
            if previous[2] and worker in self.ckpt_unacked:  # ... and saved its checkpoint state
                self.ckpt_unacked.discard(worker)
                self._maybe_commit_checkpoint()
        if tag == BYE:
            self.said_bye.add(worker)
            return None
        if tag == HELLO:  # a rejoining worker: the current parameters and what to compute next
            self._reply(worker, self.algo.version if self.is_async else self.current_step,
                        stop=self.finished)
            return None
        self.received[worker] += 1
        return worker, tag, float(head[2:3].view(torch.float64)), count, data[HEADER * 8 :]

    def _lose(self, worker: int, reason: str) -> None:
        self.lost[worker] = reason
        self.in_flight.pop(worker, None)

    def _reply(self, worker: int, tag: int, stop: bool) -> None:
        msg = torch.empty(self.reply_bytes, dtype=torch.uint8)
        flag = self.ckpt_step if worker in self.ckpt_unflagged and not stop else 0
        self.ckpt_unflagged.discard(worker)
        msg[: REPLY * 8].view(torch.int64).copy_(torch.tensor([tag, int(stop), flag]))
        msg[REPLY * 8 :].copy_(self.algo.x.reshape(-1).view(torch.uint8))
        self.in_flight[worker] = (dist.isend(msg, dst=worker + 1, tag=REPLY_TAG), msg, flag)
        self.run.transport.bytes_sent += self.reply_bytes
        if stop:
            self.stopped.add(worker)

    def begin_checkpoint(self, step: int) -> None:
        """Called once the server's own state for ``step`` is on disk, before any reply carries
        parameters newer than that state: every live worker's next reply asks it to save."""
        alive = {w for w in range(self.n_workers) if w not in self.lost}
        self.ckpt_step, self.ckpt_unflagged, self.ckpt_unacked = step, set(alive), set(alive)

    def _maybe_commit_checkpoint(self) -> None:
        self.ckpt_unacked -= set(self.lost)
        if self.ckpt_step and not self.ckpt_unacked:
            from gradwire.run import checkpoint

            checkpoint.mark_latest(self.run.checkpoint_folder, self.ckpt_step)
            self.ckpt_step = 0

    def release_replies(self) -> None:
        """Send the parameters of the step just applied to the workers that wait for them."""
        for w, tag, stop in self.deferred:
            self._reply(w, tag, stop)
        self.deferred = []

    def step(self, step: int) -> dict:
        self.current_step = step
        last = step == self.run.cfg.steps
        every = self.run.cfg.checkpoint_every
        # with a checkpoint after this step, replies wait until the server's state is saved
        self.checkpoint_after = step if every and step % every == 0 and not last else 0
        if self.is_async:
            return self._async_round(last)
        need = self.n_workers - self.algo.backups
        winners, losses, counts, late = {}, {}, {}, []
        while len(winners) < need:
            got = self._receive(f"step {step} ({len(winners)} of {need} so far)")
            if got is None:
                continue
            worker, tag, loss, count, payload = got
            if tag == step:
                winners[worker], losses[worker], counts[worker] = payload, loss, count
                self.awaiting.append(worker)
            else:  # late: computed for an earlier step; never applied, the worker catches up now
                late.append(worker)
                self._reply(worker, step, stop=False)
        self.algo.opt.apply(self.algo.aggregate(winners))
        self.deferred = [(w, step + 1, last) for w in self.awaiting]
        self.awaiting = []
        if not self.checkpoint_after:
            self.release_replies()
        return {"loss": sum(losses.values()) / need, "gradients": need, "dropped": len(late),
                "winners": sorted(winners), "winner_counts": [counts[w] for w in sorted(winners)],
                "late": sorted(late)}

    def _async_round(self, last: bool) -> dict:
        losses, staleness, dropped = [], [], 0
        i = 0
        while i < self.n_workers:
            got = self._receive(f"version {self.algo.version}")
            if got is None:
                continue
            worker, tag, loss, _, payload = got
            losses.append(loss)
            stale = self.algo.server_apply(payload, tag)
            if stale is None:
                dropped += 1
            else:
                staleness.append(stale)
            if self.checkpoint_after and i == self.n_workers - 1:
                self.deferred = [(worker, self.algo.version, False)]
            else:
                self._reply(worker, self.algo.version, stop=last and i == self.n_workers - 1)
            i += 1
        return {"loss": sum(losses) / len(losses), "gradients": len(staleness), "dropped": dropped,
                "staleness_mean": sum(staleness) / max(len(staleness), 1), "staleness_max": max(staleness, default=0)}

    def finish(self) -> dict:
        """Tell every worker to stop (answering late gradients with STOP), hear every goodbye, then
        release them all together, so no process leaves the group (closing its connections) while
        another still exchanges. Bounded by the timeout: a worker that never answers is lost."""
        deadline = time.perf_counter() + self.timeout_s
        self.finished = True
        while len(self.said_bye | set(self.lost)) < self.n_workers:
            try:
                got = self._receive("the last messages", deadline)
            except CommunicationError:
                break
            if got is not None and got[0] not in self.stopped:
                self._reply(got[0], -1, stop=True)
        for w in range(self.n_workers):
            if w not in self.said_bye and w not in self.lost:
                self.lost[w] = "did not finish"
        self._maybe_commit_checkpoint()
        release = torch.ones(1, dtype=torch.int64)
        works = [dist.isend(release, dst=w + 1, tag=RELEASE_TAG) for w in sorted(self.said_bye)]
        for work in works:
            try:
                _wait(work, 10.0, "")
            except CommunicationError:
                pass
        return {"lost_workers": sorted(self.lost), "lost_reasons": {str(k): v for k, v in self.lost.items()},
                "gradients_received": {str(w): n for w, n in self.received.items()}}


def _hello(run, w: int, payload: int, reply: torch.Tensor, timeout_s: float) -> int:
    msg = torch.zeros(HEADER * 8 + payload, dtype=torch.uint8)
    msg[: HEADER * 8].view(torch.int64).copy_(torch.tensor([HELLO, payload, 0, w, 0]))
    send = dist.isend(msg, dst=0, tag=GRAD_TAG)
    what = f"worker {w}: the parameter server did not answer its rejoin within {timeout_s:g} s"
    _wait(dist.irecv(reply, src=0, tag=REPLY_TAG), timeout_s, what)
    _wait(send, timeout_s, what)
    run.algorithm.x.copy_(reply[REPLY * 8 :].view(run.algorithm.x.dtype))
    head = reply[: REPLY * 8].view(torch.int64)
    if int(head[2]):  # a checkpoint is being taken: this worker's (fresh) state belongs in it
        run.save_worker_checkpoint(int(head[2]), {"tag": int(head[0]), "count": 0})
    return int(head[0])


def run_worker(run) -> dict:
    """The loop of worker process w (process w+1): compute at the parameters it holds, push, pull."""
    (w,) = run.ctx.local_ranks
    algo = run.algorithm
    x = algo.x
    timeout_s = run.cfg.timeout_s
    payload = _payload_size(algo, x)
    reply = torch.empty(REPLY * 8 + x.numel() * x.element_size(), dtype=torch.uint8)
    tag = 0 if algo.name == "async" else 1
    count = 0
    if run.ps_resume:  # where this worker stood when its checkpoint was taken
        tag, count = run.ps_resume["tag"], run.ps_resume["count"]
    if run.ps_rejoin:  # lost before the checkpoint: fetch the parameters, then start afresh
        tag = _hello(run, w, payload, reply, timeout_s)
    while True:
        run.oracle.step = tag
        loss, g = run.ctx.gradient(w, x)
        count += 1
        packet = algo.codec.encode(w, g)
        msg = torch.zeros(HEADER * 8 + payload, dtype=torch.uint8)
        head = msg[: HEADER * 8].view(torch.int64)
        head.copy_(torch.tensor([tag, packet.nbytes, 0, w, count]))
        head[2:3].view(torch.float64).fill_(loss)
        msg[HEADER * 8 :].copy_(packet.buffer)
        send = dist.isend(msg, dst=0, tag=GRAD_TAG)
        what = f"worker {w}: the parameter server did not answer within {timeout_s:g} s"
        _wait(dist.irecv(reply, src=0, tag=REPLY_TAG), timeout_s, what)
        _wait(send, timeout_s, what)
        head = reply[: REPLY * 8].view(torch.int64)
        x.copy_(reply[REPLY * 8 :].view(x.dtype))
        next_tag = int(head[0])
        if int(head[2]):  # the server saved step head[2]: save this worker's state beside it
            run.save_worker_checkpoint(int(head[2]), {"tag": next_tag, "count": count})
        if int(head[1]):
            msg.zero_()
            msg[: HEADER * 8].view(torch.int64).copy_(torch.tensor([BYE, 0, 0, w, count]))
            _wait(dist.isend(msg, dst=0, tag=GRAD_TAG), timeout_s, f"worker {w}: the parameter server took no goodbye")
            _wait(dist.irecv(torch.empty(1, dtype=torch.int64), src=0, tag=RELEASE_TAG), timeout_s,
                  f"worker {w}: no release from the parameter server")
            return {"worker": w, "gradients_sent": count}
        tag = next_tag
        run.kill_point(count)
