"""Server mode: the messages of the algorithms that have a server.

Sync SGD with backup workers, asynchronous SGD, asynchronous EASGD and asynchronous LSGD have one
more participant than their workers: a parameter server or coordinator (``transports.SERVER``).
Each states its protocol once, in three methods of :class:`~gradwire.algorithms.base.Algorithm`:

- ``worker_step(ctx, rank, count)``: worker ``rank`` computes (its ``count``-th gradient or local
  step) and returns the :class:`Message` it sends to the server;
- ``on_message(message, finished)``: the server's handling of one message, in arrival order:
  an :class:`Answer` with the replies to send and, when this message completed a step of the
  run, that step's figures;
- ``worker_apply(ctx, rank, reply)``: the worker applies a reply; it may return a message to send
  at once, before computing again (a leader's upload).

Two drivers run them, and no driver knows which algorithm it runs: the simulator's
(``servers/simulated.py``: messages in simulated-event order, each priced by the network model)
and the real one (``servers/real.py``: an inbox over the transport's point-to-point calls).

On the wire a message is a header of ``HEADER_WORDS`` int64 words, then a body of ``body_bytes``
bytes when there is one (a gradient's payload, parameters)::

    [kind, worker, tag, count, body_bytes, value (float64 bits), flags, checkpoint step]

``worker`` is the sender (to the server) or the addressee (from it); ``count`` is the worker's
step count when it sent (the drivers keep it); ``tag`` and ``value`` mean what the kind says
(the step or parameter version a gradient was computed for, a round; a loss, a pull weight).
``flags`` and the checkpoint step belong to the drivers (stop; take a checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

HEADER_WORDS = 8
HEADER_BYTES = HEADER_WORDS * 8

# worker -> server (algorithms)
GRADIENT, REPORT, LEAD = 1, 2, 3
# server -> worker (algorithms)
PARAMS, GO, ELASTIC, UPLOAD, PULL, JOIN = 11, 12, 13, 14, 15, 16
# the drivers' own: a worker with no checkpointed state asks to rejoin (answered JOIN), says
# goodbye, acknowledges a checkpoint; the server asks for one
HELLO, BYE, ACK, SAVE = 21, 22, 23, 24
WORKER_KINDS = frozenset({GRADIENT, REPORT, LEAD, HELLO, BYE, ACK})
SERVER_KINDS = frozenset({PARAMS, GO, ELASTIC, UPLOAD, PULL, JOIN, SAVE})
STOP = 1  # flag: the run is over; the worker applies the reply, says goodbye and leaves


def as_body(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a message body (a copy: the tensor may change while the message travels)."""
    return t.detach().reshape(-1).view(torch.uint8).clone()


@dataclass
class Message:
    kind: int
    worker: int
    tag: int = 0
    count: int = 0
    value: float = 0.0
    body: torch.Tensor | None = None  # uint8
    flags: int = 0
    checkpoint: int = 0

    @property
    def body_bytes(self) -> int:
        return 0 if self.body is None else int(self.body.numel())

    @property
    def nbytes(self) -> int:
        """What crosses the wire: the header and the body."""
        return HEADER_BYTES + self.body_bytes

    @property
    def stop(self) -> bool:
        return bool(self.flags & STOP)

    def tensor(self, like: torch.Tensor) -> torch.Tensor:
        """The body read as a tensor of ``like``'s dtype and shape."""
        return self.body.view(like.dtype).view(like.shape)

    def header(self) -> torch.Tensor:
        head = torch.tensor([self.kind, self.worker, self.tag, self.count, self.body_bytes, 0, self.flags,
                             self.checkpoint], dtype=torch.int64)
        head[5:6].view(torch.float64).fill_(self.value)
        return head

    def to_wire(self) -> torch.Tensor:
        """Header and body as one uint8 buffer."""
        head = self.header().view(torch.uint8)
        return head if self.body is None else torch.cat([head, self.body])

    @classmethod
    def from_header(cls, head: torch.Tensor, body: torch.Tensor | None = None) -> Message:
        """``head``: the ``HEADER_BYTES`` of a header (uint8) or its int64 words."""
        words = head.view(torch.int64) if head.dtype == torch.uint8 else head
        return cls(int(words[0]), int(words[1]), int(words[2]), int(words[3]), float(words[5:6].view(torch.float64)),
                   body, int(words[6]), int(words[7]))

    @classmethod
    def from_wire(cls, wire: torch.Tensor) -> Message:
        msg = cls.from_header(wire[:HEADER_BYTES])
        n = int(wire[:HEADER_BYTES].view(torch.int64)[4])
        msg.body = wire[HEADER_BYTES:HEADER_BYTES + n] if n else None
        return msg

    def state_dict(self) -> dict:
        return {"header": self.header(), "body": torch.empty(0, dtype=torch.uint8) if self.body is None else self.body}

    @classmethod
    def from_state(cls, state: dict) -> Message:
        body = state["body"]
        return cls.from_header(state["header"], body.clone() if body.numel() else None)


@dataclass
class Answer:
    """The server's handling of one message: replies to send (each to its ``worker``), and the
    figures of the step this message completed (None while the step goes on). ``dropped``: the
    message's gradient was not applied (late, too stale); ``staleness``: updates since its
    parameters were read, where the algorithm measures it (both for the timeline)."""

    replies: list[Message] = field(default_factory=list)
    step: dict | None = None
    dropped: bool = False
    staleness: float = float("nan")


class GradientWorkers:
    """The worker side of the parameter-server protocols (sync with backups, async): each local
    worker holds the parameters of the server's last PARAMS answer and the tag that came with them
    (the step to compute for, or the parameter version read), computes its gradient there and
    sends it as GRADIENT with that tag."""

    def __init__(self, ranks, params: torch.Tensor, first_tag: int):
        self.held = {r: params.clone() for r in ranks}
        self.tag = {r: first_tag for r in ranks}

    def message(self, ctx, rank: int, count: int, averager) -> Message:
        loss, g = ctx.gradient(rank, self.held[rank])
        body = averager.encode(rank, g).buffer  # a CompressedMean: the payload goes to the server
        return Message(GRADIENT, rank, tag=self.tag[rank], count=count, value=loss, body=body)

    def apply(self, rank: int, reply: Message) -> None:
        """A PARAMS (or JOIN) answer: compute at its parameters, for its tag, next."""
        self.held[rank].copy_(reply.tensor(self.held[rank]))
        self.tag[rank] = reply.tag

    def state_dict(self) -> dict:
        return {"held": {str(r): t for r, t in self.held.items()}, "tag": {str(r): v for r, v in self.tag.items()}}

    def load_state_dict(self, state: dict) -> None:
        for r in self.held:
            self.held[r].copy_(state["held"][str(r)])
            self.tag[r] = int(state["tag"][str(r)])

