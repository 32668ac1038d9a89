"""2.5-D tensor parallelism (SUMMA2.5-LM: Wang, Xu, Bian and You 2021) and 2-D as its depth-1 case.

P = q·q·d processes on a [d, q, q] mesh (:mod:`gradwire.parallel.mesh`): each depth layer k is a
q x q SUMMA grid (:mod:`gradwire.parallel.tp2d`) over its own slice of the batch. A linear layer
keeps the weight block W[j, i] ([in/q, out/q]) on rank (i, j, k) for every k, so the weight is
replicated over depth while the input block is [batch/(d·q), seq, in/q]: sequence block k·q + j,
features block i.

Each depth replica of W sees a different part of the batch, so its gradient is the sum of the
replicas' gradients: the weight passes through ``copy_to(depth)``, which all-reduces its gradient
over the depth group (2·(d-1)·W/q² bytes per group; Colossal-AI's legacy ``Linear2p5D`` leaves
this out, which is correct only for d = 1). The bias block b[i] is replicated over the column and
the depth, so its gradient is all-reduced over both.
"""

from __future__ import annotations

import torch
from torch import nn

from gradwire.parallel.comm import replicated
from gradwire.parallel.tp2d import summa


def sequence_block(x: torch.Tensor, mesh) -> torch.Tensor:
    """This rank's sequences of a batch ``x`` (first dimension): block k·q + j of d·q."""
    n = x.shape[0] // (mesh.layout.q * mesh.layout.d)
    start = (mesh.k * mesh.layout.q + mesh.j) * n
    return x[start : start + n]


class Linear2p5D(nn.Module):
    """Y[j, i] = Σ_t X[j, t] W[t, i] + b[i] in every depth layer (2-D when d = 1)."""

    def __init__(self, in_features: int, out_features: int, mesh, *, dtype: torch.dtype, bias: bool = True):
        super().__init__()
        q = mesh.layout.q
        self.mesh, self.label = mesh, ""
        self.weight = nn.Parameter(torch.empty(in_features // q, out_features // q, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features // q, dtype=dtype)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.mesh
        w = replicated(self.weight, [m.depth], self.label)  # gradients all-reduced across depth
        y = summa(x.reshape(-1, x.shape[-1]), w, m.row, m.col, self.label).view(*x.shape[:-1], -1)
        if self.bias is not None:
            y = y + replicated(self.bias, [m.col, m.depth], self.label)
        return y
