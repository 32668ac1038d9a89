"""Error feedback as a wrapper around any compressor.

Seide, Fu, Droppo, Li, Yu (2014), "1-bit stochastic gradient descent and its application to
data-parallel distributed training of speech DNNs", Interspeech; analysed by Stich, Cordonnier,
Jaggi (2018) and Karimireddy, Rebjock, Stich, Jaggi (2019). What compression drops is not lost but
added to the next message of the same tensor:

    corrected = x + residual[key]
    packet    = compressor.encode(lam * corrected)     # lam = 1 unless C is not a contraction (below)
    residual[key] = corrected - compressor.decode(packet)

so that ``x + residual_before == decode(packet) + residual_after`` (up to float rounding).

Error feedback is stable only for a *contractive* compressor, ``E||C(v) - v||^2 <= (1 - delta)||v||^2``
with ``delta > 0`` (the assumption of Stich et al. 2018 and Karimireddy et al. 2019): then the
residual stays within a constant times the gradients. An unbiased compressor with variance bound
``omega >= 1`` (``E||C(v) - v||^2 <= omega ||v||^2``: ``qsgd`` with few levels, ``pquant``, ``randk``,
``terngrad:clip=0``) is not one, and the residual grows geometrically: with ``qsgd:levels=4``
(512-element buckets, omega = 5.66) on ``gradwire run --help``'s example it reached 459x the
gradient and the loss NaN at step 76 (20000x and NaN at step 218 at lr 0.001). The standard remedy
is to send the scaled compressor

    C'(v) = C(lam * v),   lam = 1 / (1 + omega)

which is a contraction with ``delta = 1/(1 + omega)``: for unbiased C,
``E||C(lam v) - v||^2 = (1 - lam)^2 ||v||^2 + E||C(lam v) - lam v||^2 <= ((1 - lam)^2 + omega lam^2)||v||^2
= (1 - lam)||v||^2``, a standard fact (Stich & Karimireddy 2020, "The error-feedback framework:
better rates for SGD with delayed gradients and compressed updates", JMLR; Beznosikov, Horvath,
Richtarik, Safaryan 2020, "On biased compression for distributed learning", arXiv:2002.12410:
an unbiased C with E||C(v)||^2 <= zeta ||v||^2, zeta = 1 + omega, makes C/zeta a contraction with
delta = 1/zeta). Scaling the *input* (not the decoded output) keeps the wire format the
compressor's own, so a receiver decodes as usual, and the residual is still
``corrected - decode(packet)``: the identity above holds as before. For the quantizers and
``randk`` C(lam v) has the law of lam C(v) (they are positively homogeneous), and for
``randk:ratio=r`` the result is exactly rand-k without the n/k factor, the "memory" variant of Stich
et al. 2018. Everything else is used unscaled, exactly as before: the contractions (``none``,
``natural`` with omega = 1/8, ``qsgd`` with omega < 1, ``topk``, ``sign:scaled=true``, ``threshold``,
whose residual stays below tau per element, and the casts) and the two biased codecs that no input
scaling can help: unscaled ``sign`` sends +-1 whatever the scale (its residual stays within [-1, 1]
per element while every gradient element does), and clipped ``terngrad`` declares no omega (its
residual settles at 15-90x the gradient in our runs). :func:`ef_scale` gives lam.
"""

from __future__ import annotations

import torch

from gradwire.compress.base import Compressor, Packet
from gradwire.compress.wire import work_dtype


def ef_scale(compressor: Compressor, numel: int) -> float:
    """The factor ``lam`` that error feedback applies to a tensor of ``numel`` elements before
    encoding it: ``1/(1 + omega)`` for an unbiased compressor whose variance bound ``omega`` is
    at least 1 (not a contraction), else 1 (see the module docstring)."""
    if not compressor.unbiased:
        return 1.0
    omega = compressor.omega(numel)
    if omega is None or omega < 1:
        return 1.0
    return 1.0 / (1.0 + omega)


class ErrorFeedback:
    """Keeps one residual per tensor, keyed by a name (e.g. the parameter's).

    Residuals are held in float32 (float64 for float64 tensors) even for fp16/bf16 tensors, so that
    small corrections are not rounded away; the corrected tensor is cast back to the tensor's dtype
    before encoding (the cast's rounding error goes into the residual too), so packets carry the
    tensor's own dtype. An unbiased compressor that is not a contraction (omega >= 1) encodes the
    corrected tensor times :func:`ef_scale` (``1/(1 + omega)``), the rest staying in the residual.
    A failed encode (e.g. non-finite input) leaves the residual unchanged.
    The state is a plain ``{key: tensor}`` dict, loadable with ``torch.load(weights_only=True)``.
    """

    __slots__ = ("compressor", "residuals", "scaled")

    def __init__(self, compressor: Compressor, *, scaled: bool = True):
        """``scaled=False``: encode the corrected tensor itself whatever the compressor's ω (the
        rule of methods that specify it so, MuLoCo's outer deltas), not :func:`ef_scale` times it."""
        if not isinstance(compressor, Compressor):
            raise TypeError(f"ErrorFeedback wraps a Compressor, got {type(compressor).__name__}")
        self.compressor = compressor
        self.scaled = scaled
        self.residuals: dict[str, torch.Tensor] = {}

    def encode(self, x: torch.Tensor, *, key: str, generator: torch.Generator | None = None) -> Packet:
        packet, self.residuals[key] = self.encode_pending(x, key=key, generator=generator)
        return packet

    def encode_pending(self, x: torch.Tensor, *, key: str,
                       generator: torch.Generator | None = None) -> tuple[Packet, torch.Tensor]:
        """:meth:`encode` without keeping the new residual: (the packet, the residual that
        :meth:`commit` keeps), for a caller that keeps it only once the message has been delivered."""
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
        lam = ef_scale(self.compressor, x.numel()) if self.scaled else 1.0
        send = corrected if lam == 1.0 else corrected * lam  # C(lam v): a contraction (module docstring)
        packet = self.compressor.encode(send.to(x.dtype), generator=generator)
        return packet, corrected.sub_(self.compressor.decode(packet).to(work))

    def commit(self, key: str, residual: torch.Tensor) -> None:
        """Keep ``residual`` (from :meth:`encode_pending`) as ``key``'s."""
        self.residuals[key] = residual

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
