"""Where an infrequent method keeps its outer state (``--outer-state``).

DiLoCo's global parameters θ, their outer momentum and the error-feedback residuals of its outer
gradients are touched once per round (every H inner steps), yet on the accelerator they cost as
much memory as the model again, and more (docs/gpu.md, "Memory"). ``--outer-state cpu`` keeps
them in host memory, page-locked (pinned) where CUDA is present so that the once-a-round copies
to and from the device run at full bus speed and may overlap; the inner steps are unchanged. The
arithmetic is the same on either side, so results are equal (tested on the CPU, where both
placements are the same memory).
"""

from __future__ import annotations

import dataclasses

import torch


def outer_copy(params: torch.Tensor, where: str) -> torch.Tensor:
    """A copy of ``params`` on their device (``where="device"``) or in CPU memory (``"cpu"``),
    pinned where CUDA is available (pin_memory needs a CUDA driver)."""
    if where == "device":
        return params.clone()
    out = torch.empty(params.shape, dtype=params.dtype, device="cpu", pin_memory=torch.cuda.is_available())
    return out.copy_(params)


def on_device(ctx, device: torch.device):
    """``ctx`` with its device set to ``device``, for the parts (a codec's random generators and
    residuals) that must live beside the outer state."""
    return ctx if ctx.device == device else dataclasses.replace(ctx, device=device)
