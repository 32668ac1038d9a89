"""The compressed mean: each worker's tensor encoded by a byte compressor (with error feedback when
asked), the payloads carried by the transport, decoded and averaged in rank order.

Two routes (``--compressed-mean``):

* ``gather`` (default): every worker's whole message reaches every other (an all-gather), each
  decodes all n and averages them: the exact mean of the messages; each worker receives n - 1
  messages a round, so its link carries (n - 1)·b bytes for a message of b.
* ``scatter``: the reduction is shared out (1-bit Adam's compressed allreduce: Tang et al. 2021,
  "1-bit Adam: communication efficient large-scale training with Adam's convergence speed", ICML;
  the two-sided error feedback of Tang et al. 2019, "DoubleSqueeze", ICML). Each worker encodes its
  vector in n chunks (chunk j with its own residual, when error feedback is on) and sends chunk j to
  the j-th worker (an all-to-all); worker j decodes the n messages of its chunk, averages them in
  rank order, and encodes that mean again with an error feedback of its own (always on: what its
  second compression drops goes into its next round), in the same codec or in the owners' own
  (``--owner-compressor``: e.g. more bits for the one message that every worker receives); every
  worker's chunk then goes to every other (an all-gather by direct exchange) and each decodes the n
  chunks into the mean. Each link carries 2·(n - 1)/n·b bytes a round instead of (n - 1)·b (at 16
  workers 7.5 times fewer; (n - 1)/n·(b + b') with an owners' message of b'), in two exchanges of
  one latency each; the mean is the messages' mean compressed once more, not that mean exactly. The
  chunk owner's residual is kept when the round is delivered (``wait``), so a round restarted after a
  resume (``Transport.restart``) repeats it exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gradwire.averaging.base import Averager, Finished
from gradwire.averaging.combine import MessageCombine
from gradwire.compress import Compressor, ErrorFeedback, Packet
from gradwire.compress.wire import FRAME_BYTES, frame, unframe
from gradwire.config import COMPRESSED_MEANS
from gradwire.errors import ConfigError
from gradwire.spec import require
from gradwire.transports.base import Handle, Transport


class ChunkSlots(Compressor):
    """``inner`` applied chunk by chunk: a vector cut in ``n`` chunks (:meth:`chunks`, as
    ``torch.tensor_split`` cuts it), each encoded into a slot of the largest chunk's size (its fixed
    size padded with zeros, or, for a bounded codec, framed at the bound: :meth:`slot_size`), the n
    slots one after another. What a worker sends on the scatter route (slot j to worker j); error
    feedback wraps it whole, one residual for the vector, the variance bound that of the largest chunk."""

    def __init__(self, inner: Compressor, n: int):
        self.inner, self.n = inner, n
        self.name, self.unbiased, self.stochastic = inner.name, inner.unbiased, inner.stochastic

    def spec(self) -> str:
        return self.inner.spec()

    def omega(self, numel: int) -> float | None:
        return self.inner.omega(-(-numel // self.n))

    def chunks(self, numel: int) -> list[tuple[int, int]]:
        """The [a, b) element ranges of the n chunks: sizes as equal as can be, the first numel mod n
        one larger."""
        q, extra = divmod(numel, self.n)
        bounds, a = [], 0
        for j in range(self.n):
            b = a + q + (j < extra)
            bounds.append((a, b))
            a = b
        return bounds

    def slot_size(self, numel: int, dtype: torch.dtype) -> tuple[int, bool]:
        """(the bytes every chunk's message travels in, whether it is framed)."""
        largest = -(-numel // self.n)
        size = self.inner.nbytes(largest, dtype)
        if size is not None:
            return size, False
        return self.inner.max_nbytes(largest, dtype) + FRAME_BYTES, True

    def nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return self.n * self.slot_size(numel, dtype)[0]

    def to_slot(self, buffer: torch.Tensor, slot: int, framed: bool) -> torch.Tensor:
        if framed:
            return frame(buffer, slot - FRAME_BYTES)
        out = torch.zeros(slot, dtype=torch.uint8, device=buffer.device)
        out[: buffer.numel()] = buffer
        return out

    def decode_slot(self, buffer: torch.Tensor, numel: int, dtype: torch.dtype, framed: bool) -> torch.Tensor:
        """One chunk of ``numel`` elements, decoded from its slot."""
        buffer = unframe(buffer, self.inner.name) if framed else buffer[: self.inner.nbytes(numel, dtype)]
        return self.inner.decode(Packet(buffer, torch.Size([numel]), dtype))

    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> Packet:
        flat = x.reshape(-1)
        slot, framed = self.slot_size(flat.numel(), x.dtype)
        buffer = torch.cat([self.to_slot(self.inner.encode(flat[a:b], generator=generator).buffer, slot, framed)
                            for a, b in self.chunks(flat.numel())])
        return Packet(buffer, x.shape, x.dtype)

    def decode(self, packet: Packet) -> torch.Tensor:
        numel = packet.numel
        slot, framed = self.slot_size(numel, packet.dtype)
        if framed:
            parts = [self.decode_slot(packet.buffer[j * slot:(j + 1) * slot], b - a, packet.dtype, framed)
                     for j, (a, b) in enumerate(self.chunks(numel))]
            return torch.cat(parts).view(packet.shape)
        # a fixed size: the slots of the longer chunks (the first numel mod n), then the shorter, each
        # group decoded in one pass (``Compressor.decode_rows``)
        rows = packet.buffer.view(self.n, slot)
        q, extra = divmod(numel, self.n)
        parts = [self.inner.decode_rows(rows[:extra], q + 1, packet.dtype).reshape(-1)] if extra else []
        if q:
            parts.append(self.inner.decode_rows(rows[extra:], q, packet.dtype).reshape(-1))
        return torch.cat(parts).view(packet.shape) if parts else torch.empty(packet.shape, dtype=packet.dtype,
                                                                              device=packet.buffer.device)

    def decode_slots(self, slots: list[torch.Tensor], numel: int, dtype: torch.dtype,
                     framed: bool) -> list[torch.Tensor]:
        """Several messages of one chunk of ``numel`` elements (a chunk owner's n), decoded; in one
        pass where the codec's size is fixed."""
        if framed:
            return [self.decode_slot(b, numel, dtype, framed) for b in slots]
        return list(self.inner.decode_rows(torch.stack(slots), numel, dtype))


class CompressedMean(Averager):
    """One compressor, an optional error-feedback memory and a seeded generator per local worker.

    ``mean`` is a dense allreduce when the payload is summable (uncompressed, or a cast), else an
    allgather of the byte buffers, each decoded and summed in rank order (so every backend and the
    parameter server add in the same order). Algorithms that send payloads themselves (to a
    server, or overlapped with computation) use ``encode``, ``payloads``, ``start_payloads`` and
    ``decode_mean``."""

    def __init__(self, compressor: Compressor, generators: dict[int, torch.Generator], *, error_feedback: bool,
                 identity: bool = False, scaled_error_feedback: bool = True, route: str = "gather",
                 world_size: int = 0, owner_generator: Callable[[int], torch.Generator] | None = None,
                 owner_compressor: Compressor | None = None):
        """``route``: ``gather`` or ``scatter`` (module docstring); ``scatter`` needs ``world_size``
        (the chunks, one per worker) and ``owner_generator(rank)``, the random stream of the chunk
        that worker ``rank`` owns (its second encode), and takes ``owner_compressor``, the codec of
        that second encode (default: ``compressor``)."""
        self.compressor = compressor
        self.identity = identity  # the spec asked for no compression ("none")
        # what a worker's message is: the compressor's packet, or on the scatter route its n chunks' slots
        self.sent = ChunkSlots(compressor, world_size) if route == "scatter" else compressor
        self.ef = ({r: ErrorFeedback(self.sent, scaled=scaled_error_feedback) for r in generators}
                   if error_feedback else None)
        self.gen = generators
        self.combine: MessageCombine | None = None  # None: the plain mean of the decoded payloads
        require(route in COMPRESSED_MEANS,
                f"compressed_mean={route!r}: valid choices are {', '.join(COMPRESSED_MEANS)} (--compressed-mean)")
        self.route = route
        if route == "scatter":
            if self.plain() or compressor.summable:
                raise ConfigError(f"compressed_mean=scatter shares out the decoding of compressed messages; "
                                  f"--compressor {compressor.spec()} is summed by an allreduce already "
                                  "(--compressed-mean gather)")
            if compressor.max_nbytes(1024, torch.float32) is None:
                raise ConfigError(f"compressed_mean=scatter needs messages of a known size or bound; --compressor "
                                  f"{compressor.spec()} has neither (--compressed-mean gather)")
            require(world_size > 0 and owner_generator is not None,
                    "compressed_mean=scatter needs the world size and the owners' random streams")
            owner_compressor = owner_compressor or compressor
            if owner_compressor.max_nbytes(1024, torch.float32) is None:
                raise ConfigError(f"--owner-compressor {owner_compressor.spec()}: the owners' messages need a known "
                                  "size or bound (a fixed-size codec, or top-k)")
            self.world_size = world_size
            # what an owner sends: its chunk's mean in the owners' codec, in a slot of its own size
            self.owned = ChunkSlots(owner_compressor, world_size)
            self.owner_ef = {r: ErrorFeedback(owner_compressor, scaled=scaled_error_feedback) for r in generators}
            self.owner_gen = {r: owner_generator(r) for r in generators}
            # (owner rank, key) -> (its new residual, its generator's new state): kept at delivery
            self.pending: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def combine_by(self, rule: MessageCombine) -> None:
        """Gathered payloads are combined by ``rule`` (averaging/combine.py) instead of the plain mean;
        the payloads and their bytes are unchanged."""
        self._require_gathered(f"aggregate={rule.aggregate}")
        require(not self.allreduced(),
                f"aggregate/clip apply to gathered payloads; {self.compressor.spec()} is all-reduced")
        require(not rule.needs_positions or hasattr(self.compressor, "decode_sent"),
                f"aggregate={rule.aggregate} needs the positions each payload carries, which "
                f"{self.compressor.spec()} does not expose (chunked-topk does)")
        self.combine = rule

    def spec(self) -> str:
        return self.compressor.spec()

    def encode(self, rank: int, x: torch.Tensor, *, key: str = "grad") -> Packet:
        """``key`` names the tensor whose residual error feedback keeps (one per key)."""
        if self.ef is not None:
            return self.ef[rank].encode(x, key=key, generator=self.gen[rank])
        return self.sent.encode(x, generator=self.gen[rank])

    def decode(self, buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return self.compressor.decode(Packet(buffer, like.shape, like.dtype))

    def plain(self) -> bool:
        """Uncompressed and without error feedback: the tensors travel as they are."""
        return self.identity and self.ef is None

    def allreduced(self) -> bool:
        """Whether the mean travels as one dense allreduce (uncompressed, or a cast whose payloads sum
        on the way); otherwise the packets' bytes are allgathered and decoded."""
        return self.plain() or self.compressor.summable

    def _require_gathered(self, what: str) -> None:
        """Refuse, in one line, a use that needs every worker's whole message (a server, a combine
        rule, backup workers) on the scatter route."""
        if self.route == "scatter":
            raise ConfigError(f"compressed_mean=scatter: {what} needs every worker's whole message, which the "
                              "scatter route never gathers (--compressed-mean gather)")

    def mean(self, transport: Transport, tensors: dict[int, torch.Tensor], ranks=None) -> torch.Tensor:
        like = next(iter(tensors.values()))
        if self.route == "scatter":
            return self.start_payloads(transport, self.payloads(tensors), like, ranks).wait()
        if self.plain():
            return transport.allreduce_mean(tensors, ranks)
        packets = {r: self.encode(r, t) for r, t in tensors.items()}
        if self.compressor.summable:
            wire_dtype = self.compressor.wire_dtype(like.dtype)
            wire = {r: self.decode(p.buffer, like).to(wire_dtype) for r, p in packets.items()}
            return transport.allreduce_mean(wire, ranks).to(like.dtype)
        return self.decode_mean(self.gather(transport, {r: p.buffer for r, p in packets.items()}, like, ranks), like)

    def gather(self, transport: Transport, buffers: dict[int, torch.Tensor], like: torch.Tensor,
               ranks=None) -> dict[int, torch.Tensor]:
        """Every participant's payload for a tensor like ``like``: one all-gather at ``wire_size``
        (framed where the codec is bounded), the payloads given back as they were sent."""
        self._require_gathered("gathering every payload")
        size, framed = self.wire_size(like)
        return self._unframed(transport.allgather(self._framed(buffers, size, framed), ranks, size=size), framed)

    def wire_size(self, like: torch.Tensor) -> tuple[int | None, bool]:
        """(the size every gathered payload travels at, whether it is framed): the codec's fixed
        size; or, for a codec whose size depends on the data within a bound (top-k and chunked top-k:
        a fixed count of Golomb-coded positions), the bound plus a 4-byte length (``wire.frame``),
        so that no transport exchanges sizes first (a blocking collective of n - 1 latencies before
        every round, which no overlap hides); (None, False) for an unbounded one (threshold)."""
        size = self.compressor.nbytes(like.numel(), like.dtype)
        if size is not None:
            return size, False
        bound = self.compressor.max_nbytes(like.numel(), like.dtype)
        return (None, False) if bound is None else (bound + FRAME_BYTES, True)

    @staticmethod
    def _framed(buffers: dict[int, torch.Tensor], size: int | None, framed: bool) -> dict[int, torch.Tensor]:
        return {r: frame(b, size - FRAME_BYTES) for r, b in buffers.items()} if framed else buffers

    def _unframed(self, buffers: dict[int, torch.Tensor], framed: bool) -> dict[int, torch.Tensor]:
        return {r: unframe(b, self.compressor.name) for r, b in buffers.items()} if framed else buffers

    def start(self, transport: Transport, tensors: dict[int, torch.Tensor], ranks=None) -> Handle:
        return self.start_payloads(transport, self.payloads(tensors), next(iter(tensors.values())), ranks)

    def averages_buckets(self) -> bool:
        """Whether the mean taken bucket by bucket (:meth:`mean_tensors`) is, element for element,
        the mean of the whole gradient: uncompressed, and the casts (fp16, bf16: element-wise,
        summed element-wise). Not with error feedback (its residual is kept for the whole gradient),
        nor for the compressors that look at the whole vector or draw random numbers along it:
        top-k, threshold, random-k (a selection over all of it), sign (its scale, mean |x|),
        TernGrad (max |x|), pquant and qsgd (norms of blocks laid along the flat vector, and random
        draws in its order), natural (random draws in its order)."""
        return self.ef is None and (self.identity or self.compressor.summable)

    def mean_tensors(self, transport: Transport, tensors: dict[int, Sequence[torch.Tensor]],
                     indices: Sequence[int]) -> list[torch.Tensor]:
        """Uncompressed or a cast: one allreduce of the bucket, as :meth:`mean`."""
        if not self.averages_buckets():
            return super().mean_tensors(transport, tensors, indices)
        like = next(iter(tensors.values()))
        mean = self.mean(transport, {r: torch.cat([t.reshape(-1) for t in ts]) for r, ts in tensors.items()})
        return [m.view(t.shape) for m, t in zip(mean.split([t.numel() for t in like]), like, strict=True)]

    def payloads(self, tensors: dict[int, torch.Tensor], *, key: str = "grad") -> dict[int, torch.Tensor]:
        """What each local participant puts on the wire for ``start_payloads``: its tensor (no
        compression), the decoded cast in the wire dtype (a summable compressor), or its packet's
        bytes. Encoding happens here, once: a payload kept in a checkpoint can be sent again
        without touching the residuals or the generators."""
        if self.plain():
            return {r: t.clone() for r, t in tensors.items()}
        like = next(iter(tensors.values()))
        if self.route == "scatter":
            return {r: self.encode(r, t.reshape(-1), key=key).buffer for r, t in tensors.items()}
        packets = {r: self.encode(r, t, key=key) for r, t in tensors.items()}
        if self.compressor.summable:
            wire_dtype = self.compressor.wire_dtype(like.dtype)
            return {r: self.decode(p.buffer, like).to(wire_dtype) for r, p in packets.items()}
        return {r: p.buffer for r, p in packets.items()}

    def start_payloads(self, transport: Transport, payloads: dict[int, torch.Tensor], like: torch.Tensor,
                       ranks=None, *, key: str = "grad") -> Handle:
        """Start the mean of ``payloads`` without blocking, carried as ``mean`` carries them (a dense
        allreduce, or an allgather of the bytes decoded and summed in rank order, or on the scatter
        route the owners' exchange); ``wait()`` gives it in ``like``'s dtype. ``key``: the one
        ``payloads`` was given (the chunk owners' residuals are kept per key)."""
        if self.route == "scatter":
            if ranks is not None and sorted(ranks) != list(range(self.world_size)):
                raise ConfigError(f"compressed_mean=scatter needs every worker in every round (a chunk each); "
                                  f"this round has {len(ranks)} of {self.world_size} (--compressed-mean gather)")
            slot, framed = self.slot_size(like.numel(), like.dtype)
            owned_slot, _ = self.owned.slot_size(like.numel(), like.dtype)
            handle = transport.exchange_reduce_start(
                payloads, lambda r, got: self.reduce_chunk(r, got, like, key), ranks, size=slot,
                reduced_size=owned_slot)
            return Finished(handle, lambda owned: self.assemble(owned, like, key))
        if self.allreduced():
            return Finished(transport.allreduce_mean_start(payloads, ranks), lambda mean: mean.to(like.dtype))
        size, framed = self.wire_size(like)
        return Finished(transport.allgather_start(self._framed(payloads, size, framed), ranks, size=size),
                        lambda gathered: self.decode_mean(self._unframed(gathered, framed), like))

    def decode_payload(self, payload: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """One participant's payload as the mean counts it (its share of the average, times n): what
        the others received from it, error feedback and quantisation included."""
        if self.allreduced():
            return payload.to(like.dtype)
        if self.route == "scatter":
            return self.sent.decode(Packet(payload, like.shape, like.dtype))
        return self.decode(payload, like)

    def decode_mean(self, buffers: dict[int, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """Decode every payload and average them, summed in rank order (so every backend and the
        parameter server add in the same order); with a :class:`MessageCombine` set
        (:meth:`combine_by`), combined by its rule instead."""
        self._require_gathered("decoding every worker's message")
        order = sorted(buffers)
        if self.combine is not None:
            return self._combined([buffers[r] for r in order], like)
        total = self.decode(buffers[order[0]], like).clone()
        for r in order[1:]:
            total += self.decode(buffers[r], like)
        return total.div_(len(order))

    def _combined(self, buffers: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        if not self.combine.needs_positions:
            return self.combine([self.decode(b, like).reshape(-1) for b in buffers]).view(like.shape)
        parts = [self.compressor.decode_sent(Packet(b, like.shape, like.dtype)) for b in buffers]
        return self.combine([m.reshape(-1) for m, _ in parts], [s.reshape(-1) for _, s in parts]).view(like.shape)

    # -- the scatter route (module docstring) --------------------------------------------------------

    def chunks(self, numel: int) -> list[tuple[int, int]]:
        """The scatter route's chunks, chunk j owned by the j-th worker (``ChunkSlots.chunks``)."""
        return self.sent.chunks(numel)

    def slot_size(self, numel: int, dtype: torch.dtype) -> tuple[int, bool]:
        """(the bytes each chunk's message travels in, whether it is framed: ``ChunkSlots.slot_size``)."""
        return self.sent.slot_size(numel, dtype)

    def reduce_chunk(self, rank: int, received: dict[int, torch.Tensor], like: torch.Tensor, key: str) -> torch.Tensor:
        """What the owner ``rank`` sends on: the mean of its chunk's n messages (decoded, summed in rank
        order), encoded again with its own error feedback (the residual kept at delivery: ``assemble``)."""
        a, b = self.chunks(like.numel())[sorted(received).index(rank)]
        _, framed = self.slot_size(like.numel(), like.dtype)
        order = sorted(received)
        decoded = self.sent.decode_slots([received[r] for r in order], b - a, like.dtype, framed)
        total = decoded[0].clone()
        for d in decoded[1:]:
            total += d
        gen = torch.Generator(device=self.owner_gen[rank].device)
        gen.set_state(self.owner_gen[rank].get_state())
        packet, residual = self.owner_ef[rank].encode_pending(total.div_(len(order)), key=key, generator=gen)
        self.pending[(rank, key)] = residual, gen.get_state()
        return self.owned.to_slot(packet.buffer, *self.owned.slot_size(like.numel(), like.dtype))

    def assemble(self, owned: dict[int, torch.Tensor], like: torch.Tensor, key: str) -> torch.Tensor:
        """The mean from the owners' chunks (keyed by owner rank), and each local owner's residual and
        random stream kept: the round has been delivered."""
        mean = self.owned.decode(Packet(torch.cat([owned[r] for r in sorted(owned)]), like.shape, like.dtype))
        for r in self.owner_ef:
            residual, gen_state = self.pending.pop((r, key))
            self.owner_ef[r].commit(key, residual)
            self.owner_gen[r].set_state(gen_state)
        return mean

    def per_worker_state(self) -> tuple[str, ...]:
        owners = ("owner_generators", "owner_error_feedback") if self.route == "scatter" else ()
        return ("generators",) + (("error_feedback",) if self.ef is not None else ()) + owners

    def state_dict(self) -> dict:
        out = {"generators": {str(r): g.get_state() for r, g in self.gen.items()}}
        if self.ef is not None:
            out["error_feedback"] = {str(r): ef.state_dict() for r, ef in self.ef.items()}
        if self.route == "scatter":
            out["owner_generators"] = {str(r): g.get_state() for r, g in self.owner_gen.items()}
            out["owner_error_feedback"] = {str(r): ef.state_dict() for r, ef in self.owner_ef.items()}
        return out

    def load_state_dict(self, state: dict) -> None:
        for r, g in self.gen.items():
            g.set_state(state["generators"][str(r)])
        if self.ef is not None:
            for r, ef in self.ef.items():
                ef.load_state_dict(state["error_feedback"][str(r)])
        if self.route == "scatter":
            for r, g in self.owner_gen.items():
                g.set_state(state["owner_generators"][str(r)])
            for r, ef in self.owner_ef.items():
                ef.load_state_dict(state["owner_error_feedback"][str(r)])
