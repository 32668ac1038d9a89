"""2.5-D tensor parallelism (SUMMA2.5-LM: Wang, Xu, Bian and You 2021) and 2-D as its depth-1 case.

P = q·q·d processes on a [d, q, q] mesh (:mod:`gradwire.parallel.mesh`): each depth layer k is a
q x q SUMMA grid (:mod:`gradwire.parallel.tp2d`) over its own slice of the batch. A linear layer
keeps the weight block W[j, i] ([in/q, out/q]) on rank (i, j, k) for every k, so the weight is
replicated over depth while the input block is [batch/(d·q), seq, in/q]: sequence block k·q + j,
features block i.

Each depth layer uses the whole block W[j, i] on a different part of the batch, so its gradient is
the sum of the layers' gradients (Colossal-AI's legacy ``Linear2p5D`` leaves this sum out, which is
correct only for d = 1). The block is held once: its rows split over the depth group
(:class:`~gradwire.parallel.comm.Partitioned`), assembled forward (d broadcasts) and its gradient
reduced to each piece's holder backward (d reduces): 2·(d-1)·W/q² bytes per block, as an all-reduce
would send. The bias block b[i] is used whole over the column and the depth, and held split over
both the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from gradwire.parallel.comm import Partitioned
from gradwire.parallel.tp2d import summa


def sequence_block(x: torch.Tensor, mesh) -> torch.Tensor:
    """This rank's sequences of a batch ``x`` (first dimension): block k·q + j of d·q. A batch that
    does not split evenly is refused: its remainder would be trained by no rank, while the loss
    still divides by the whole batch (the config check refuses such batches before a run starts)."""
    ways = mesh.layout.q * mesh.layout.d
    if x.shape[0] % ways:
        raise ValueError(f"tensor_parallel={mesh.layout.spec()} splits a batch of sequences d*q = {ways} ways: "
                         f"{x.shape[0]} sequences are not a multiple of {ways}")
    n = x.shape[0] // ways
    start = (mesh.k * mesh.layout.q + mesh.j) * n
    return x[start : start + n]


class Linear2p5D(nn.Module):
    """Y[j, i] = Σ_t X[j, t] W[t, i] + b[i] in every depth layer (2-D when d = 1)."""

    def __init__(self, in_features: int, out_features: int, mesh, *, dtype: torch.dtype, bias: bool = True):
        super().__init__()
        q = mesh.layout.q
        self.mesh, self.label = mesh, ""
        self._weight = Partitioned((in_features // q, out_features // q), [mesh.depth], partial_grads=True)
        self._bias = Partitioned((out_features // q,), [mesh.col, mesh.depth], partial_grads=True)
        self.weight = self._weight.parameter(dtype)
        self.bias = self._bias.parameter(dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.mesh
        w = self._weight.whole(self.weight, self.label)  # its gradient summed over depth
        y = summa(x.reshape(-1, x.shape[-1]), w, m.row, m.col, self.label).view(*x.shape[:-1], -1)
        if self.bias is not None:
            y = y + self._bias.whole(self.bias, self.label)
        return y
