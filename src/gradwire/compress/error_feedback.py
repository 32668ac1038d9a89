"""Error feedback as a wrapper around any compressor.

Seide, Fu, Droppo, Li, Yu (2014), "1-bit stochastic gradient descent and its application to
data-parallel distributed training of speech DNNs", Interspeech; analysed by Stich, Cordonnier,
Jaggi (2018) and Karimireddy, Rebjock, Stich, Jaggi (2019). What compression drops is not lost but
added to the next message of the same tensor:

    corrected = x + residual[key]
    packet    = compressor.encode(corrected)
    residual[key] = corrected - compressor.decode(packet)

so that ``x + residual_before == decode(packet) + residual_after`` (up to float rounding).
"""

from __future__ import annotations

import torch

from gradwire.compress.base import Compressor, Packet
from gradwire.compress.wire import work_dtype


class ErrorFeedback:
    """Keeps one residual per tensor, keyed by a name (e.g. the parameter's).

    Residuals are held in float32 (float64 for float64 tensors) even for fp16/bf16 tensors, so that
    small corrections are not rounded away; the corrected tensor is cast back to the tensor's dtype
    before encoding (the cast's rounding error goes into the residual too), so packets carry the
    tensor's own dtype. A failed encode (e.g. non-finite input) leaves the residual unchanged.
    The state is a plain ``{key: tensor}`` dict, loadable with ``torch.load(weights_only=True)``.
    """

    __slots__ = ("compressor", "residuals")

    def __init__(self, compressor: Compressor):
        if not isinstance(compressor, Compressor):
            raise TypeError(f"ErrorFeedback wraps a Compressor, got {type(compressor).__name__}")
        self.compressor = compressor
        self.residuals: dict[str, torch.Tensor] = {}

    def encode(self, x: torch.Tensor, *, key: str, generator: torch.Generator | None = None) -> Packet:
        work = work_dtype(x.dtype)
        residual = self.residuals.get(key)
        if residual is not None and residual.shape != x.shape:
            raise ValueError(
                f"error feedback: tensor {key!r} has shape {tuple(x.shape)}, "
                f"its residual {tuple(residual.shape)}"
            )
        corrected = x.detach().to(work, copy=True)
        if residual is not None:
            corrected.add_(residual.to(work))
        packet = self.compressor.encode(corrected.to(x.dtype), generator=generator)
        self.residuals[key] = corrected.sub_(self.compressor.decode(packet).to(work))
        return packet

    def decode(self, packet: Packet) -> torch.Tensor:
        return self.compressor.decode(packet)

    def residual(self, key: str) -> torch.Tensor | None:
        return self.residuals.get(key)

    def reset(self, key: str | None = None) -> None:
        """Forget every residual, or only ``key``'s."""
        if key is None:
            self.residuals.clear()
        else:
            self.residuals.pop(key, None)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {key: r.clone() for key, r in self.residuals.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        bad = [k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if bad:
            raise ValueError(f"error feedback state must map names to tensors; bad entries: {bad[:5]}")
        self.residuals = {key: v.detach().clone() for key, v in state.items()}

    def __repr__(self) -> str:
        return f"<error feedback {self.compressor.spec()}, {len(self.residuals)} residuals>"
