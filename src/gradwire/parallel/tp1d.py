"""1-D tensor parallelism (Megatron-LM, Shoeybi et al. 2019): column- and row-parallel linear layers.

A column-parallel layer holds rows ``[p·out/P, (p+1)·out/P)`` of the weight (``nn.Linear``'s [out,
in] layout) and the same slice of the bias; its input is replicated over the group and its output
split by features. A row-parallel layer holds columns ``[p·in/P, (p+1)·in/P)`` of the weight; it
takes the split input and sums the partial products over the group, then adds the bias, which
every rank uses whole and holds a piece of (:class:`~gradwire.parallel.comm.Partitioned`: one
broadcast of each piece forward). A pair (column then row, as in an MLP or attention) costs one
all-reduce of the activation forward (the row layer's g), one backward (the column layer's f), and
the bias's pieces.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gradwire.parallel.comm import Partitioned, copy_to, reduce_from


class ColumnParallelLinear(nn.Module):
    """y_p = x W_pᵀ + b_p: the input replicated, the output's features split over the group."""

    def __init__(self, in_features: int, out_features: int, mesh, *, dtype: torch.dtype, bias: bool = True):
        super().__init__()
        P = mesh.layout.p
        self.mesh, self.label = mesh, ""
        self.weight = nn.Parameter(torch.empty(out_features // P, in_features, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features // P, dtype=dtype)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to(x, self.mesh.tp, self.label), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = Σ_p x_p W_pᵀ + b: the input's features split over the group, the output replicated."""

    def __init__(self, in_features: int, out_features: int, mesh, *, dtype: torch.dtype, bias: bool = True):
        super().__init__()
        P = mesh.layout.p
        self.mesh, self.label = mesh, ""
        self.weight = nn.Parameter(torch.empty(out_features, in_features // P, dtype=dtype))
        # every rank adds the whole bias and computes its whole gradient alike
        self._bias = Partitioned((out_features,), [mesh.tp], partial_grads=False)
        self.bias = self._bias.parameter(dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from(F.linear(x, self.weight), self.mesh.tp, self.label)
        return y if self.bias is None else y + self._bias.whole(self.bias, self.label)
