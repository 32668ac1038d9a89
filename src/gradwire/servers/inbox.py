"""Messages over a transport's point-to-point calls, and the server's inbox.

A message travels as its header (``HEADER_BYTES``), then its body when the header announces one,
each a uint8 buffer sent with its own tag. The server listens to each worker on a thread of its
own (a blocking receive from that worker): gloo's receive from any source fails outright once any
peer has died, and gloo's ``is_completed`` does not advance without ``wait``, so neither polling
nor any-source receives survive a lost worker. A worker that says goodbye, dies, or stays silent
past the timeout ends only its own thread, which reports it lost.
"""

from __future__ import annotations

import queue
import threading
import time

import torch

from gradwire.algorithms.protocol import HEADER_BYTES, Message
from gradwire.transports.base import SERVER, PeerLost, Sent, Transport

TO_SERVER = (41, 42)    # (header tag, body tag) of worker -> server messages
TO_WORKER = (43, 44)    # ... and of server -> worker ones
RELEASE_TAG = 45        # the server lets a worker that said goodbye leave
MAX_BODY_BYTES = 1 << 36  # a sanity bound: a header announcing more is malformed


def send_message(transport: Transport, msg: Message, src: int, dst: int, tags: tuple[int, int]) -> list[Sent]:
    """Send ``msg`` (header, then body); raises PeerLost if the transport refuses, with the bytes
    that did go (``sent_bytes``)."""
    sends: list[Sent] = []
    try:
        sends.append(transport.send(msg.header().view(torch.uint8), src, dst, tag=tags[0]))
        if msg.body is not None:
            sends.append(transport.send(msg.body, src, dst, tag=tags[1]))
    except PeerLost as e:
        e.sent_bytes = HEADER_BYTES if sends else 0
        raise
    return sends


def receive_message(transport: Transport, src: int, dst: int, tags: tuple[int, int], timeout_s: float,
                    kinds: frozenset[int], count: bool = True) -> Message:
    """The next message from ``src``; PeerLost when it does not come, or is malformed.
    ``count=False``: the caller counts its bytes (``transport.count``) when it handles it."""
    head = transport.recv(HEADER_BYTES, src, dst, tag=tags[0], timeout_s=timeout_s, count=count)
    msg, n = Message.from_header(head), int(head.view(torch.int64)[4])
    if msg.kind not in kinds or not 0 <= n <= MAX_BODY_BYTES:
        raise PeerLost(f"malformed message from {src}: kind {msg.kind}, {n} body bytes")
    if n:
        msg.body = transport.recv(n, src, dst, tag=tags[1], timeout_s=timeout_s, count=count)
    return msg


class Inbox:
    """Every worker's messages, in the order they reach the server."""

    def __init__(self, transport: Transport, n_workers: int, timeout_s: float, kinds: frozenset[int], bye: int):
        self.events: queue.Queue = queue.Queue()
        self.last_arrival = 0.0  # when the message next_message returned last reached the inbox (perf_counter)
        self.threads = [threading.Thread(target=self._listen, args=(transport, w, timeout_s, kinds, bye),
                                         daemon=True, name=f"gradwire-inbox-{w}") for w in range(n_workers)]
        for t in self.threads:
            t.start()

    def _listen(self, transport: Transport, w: int, timeout_s: float, kinds: frozenset[int], bye: int) -> None:
        while True:
            try:
                msg = receive_message(transport, w, SERVER, TO_SERVER, timeout_s, kinds, count=False)
            except PeerLost as e:
                self.events.put(("lost", w, str(e).splitlines()[0][:160]))
                return
            if msg.worker != w:
                self.events.put(("lost", w, f"malformed message: it names worker {msg.worker}"))
                return
            self.events.put(("msg", w, (msg, time.perf_counter())))
            if msg.kind == bye:
                return

    def next_message(self, deadline: float, on_lost, done=None) -> Message | None:
        """The next message in arrival order, or None once ``deadline`` (``time.perf_counter``) has
        passed; a loss met on the way goes to ``on_lost(worker, reason)``, and if ``done()`` then
        holds (the loss was what the caller still waited for) the wait ends there, with None."""
        while True:
            try:
                kind, worker, data = self.events.get(timeout=max(0.05, deadline - time.perf_counter()))
            except queue.Empty:
                return None
            if kind == "lost":
                on_lost(worker, data)
                if done is not None and done():
                    return None
                continue
            msg, self.last_arrival = data
            return msg
