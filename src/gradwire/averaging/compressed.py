"""The compressed mean: each worker's tensor encoded by a byte compressor (with error feedback when
asked), the payloads carried by the transport, decoded and averaged in rank order."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradwire.averaging.base import Averager, Finished
from gradwire.averaging.combine import MessageCombine
from gradwire.compress import Compressor, ErrorFeedback, Packet
from gradwire.compress.wire import FRAME_BYTES, frame, unframe
from gradwire.spec import require
from gradwire.transports.base import Handle, Transport


class CompressedMean(Averager):
    """One compressor, an optional error-feedback memory and a seeded generator per local worker.

    ``mean`` is a dense allreduce when the payload is summable (uncompressed, or a cast), else an
    allgather of the byte buffers, each decoded and summed in rank order (so every backend and the
    parameter server add in the same order). Algorithms that send payloads themselves (to a
    server, or overlapped with computation) use ``encode``, ``payloads``, ``start_payloads`` and
    ``decode_mean``."""

    def __init__(self, compressor: Compressor, generators: dict[int, torch.Generator], *, error_feedback: bool,
                 identity: bool = False, scaled_error_feedback: bool = True):
        self.compressor = compressor
        self.identity = identity  # the spec asked for no compression ("none")
        self.ef = ({r: ErrorFeedback(compressor, scaled=scaled_error_feedback) for r in generators}
                   if error_feedback else None)
        self.gen = generators
        self.combine: MessageCombine | None = None  # None: the plain mean of the decoded payloads

    def combine_by(self, rule: MessageCombine) -> None:
        """Gathered payloads are combined by ``rule`` (averaging/combine.py) instead of the plain mean;
        the payloads and their bytes are unchanged."""
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
        return self.compressor.encode(x, generator=self.gen[rank])

    def decode(self, buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return self.compressor.decode(Packet(buffer, like.shape, like.dtype))

    def plain(self) -> bool:
        """Uncompressed and without error feedback: the tensors travel as they are."""
        return self.identity and self.ef is None

    def allreduced(self) -> bool:
        """Whether the mean travels as one dense allreduce (uncompressed, or a cast whose payloads sum
        on the way); otherwise the packets' bytes are allgathered and decoded."""
        return self.plain() or self.compressor.summable

    def mean(self, transport: Transport, tensors: dict[int, torch.Tensor], ranks=None) -> torch.Tensor:
        like = next(iter(tensors.values()))
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
        packets = {r: self.encode(r, t, key=key) for r, t in tensors.items()}
        if self.compressor.summable:
            wire_dtype = self.compressor.wire_dtype(like.dtype)
            return {r: self.decode(p.buffer, like).to(wire_dtype) for r, p in packets.items()}
        return {r: p.buffer for r, p in packets.items()}

    def start_payloads(self, transport: Transport, payloads: dict[int, torch.Tensor], like: torch.Tensor,
                       ranks=None) -> Handle:
        """Start the mean of ``payloads`` without blocking, carried as ``mean`` carries them (a dense
        allreduce, or an allgather of the bytes decoded and summed in rank order); ``wait()`` gives
        it in ``like``'s dtype."""
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
        return self.decode(payload, like)

    def decode_mean(self, buffers: dict[int, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """Decode every payload and average them, summed in rank order (so every backend and the
        parameter server add in the same order); with a :class:`MessageCombine` set
        (:meth:`combine_by`), combined by its rule instead."""
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

    def per_worker_state(self) -> tuple[str, ...]:
        return ("generators",) + (("error_feedback",) if self.ef is not None else ())

    def state_dict(self) -> dict:
        out = {"generators": {str(r): g.get_state() for r, g in self.gen.items()}}
        if self.ef is not None:
            out["error_feedback"] = {str(r): ef.state_dict() for r, ef in self.ef.items()}
        return out

    def load_state_dict(self, state: dict) -> None:
        for r, g in self.gen.items():
            g.set_state(state["generators"][str(r)])
        if self.ef is not None:
            for r, ef in self.ef.items():
                ef.load_state_dict(state["error_feedback"][str(r)])
