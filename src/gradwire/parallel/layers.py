"""The pieces of a transformer block, split over a tensor-parallel mesh: layer norm, causal
self-attention (heads split), the 4x GELU MLP, the pre-norm block, and the vocabulary-parallel
cross entropy of the read-out. Each mirrors :mod:`gradwire.tasks.models` (the same attribute names,
so a dense model's parameters map onto the shards by name; see :mod:`gradwire.parallel.lm`).

1-D: activations are replicated over the group between blocks; attention and MLP are a
column-parallel then a row-parallel linear layer (Megatron-LM), the norms are computed whole on
every rank. 2-D / 2.5-D: every activation is split, [sequences/(d·q), seq, features/q]; every
linear layer is :class:`~gradwire.parallel.tp2p5d.Linear2p5D`; the norm's statistics are summed
along the row (which holds one token's features). A tensor that several ranks use whole is held
split over them (:func:`held_whole`, :class:`~gradwire.parallel.comm.Partitioned`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gradwire.parallel.comm import Partitioned, copy_to, reduce_from
from gradwire.parallel.tp1d import ColumnParallelLinear, RowParallelLinear
from gradwire.parallel.tp2p5d import Linear2p5D, sequence_block


def split_ways(mesh) -> int:
    """How many ways features and heads are split: p (1-D) or q (2-D, 2.5-D)."""
    return mesh.layout.p if mesh.layout.kind == "1d" else mesh.layout.q


def held_whole(mesh, shape: tuple[int, ...]) -> Partitioned:
    """How a tensor is held that every rank with its feature block uses whole: 1-D, the whole
    group (every rank computes the same whole gradient); SUMMA, the column and the depth (each
    works on its own sequences, so the gradients are summed)."""
    if mesh.layout.kind == "1d":
        return Partitioned(shape, [mesh.tp], partial_grads=False)
    return Partitioned(shape, [mesh.col, mesh.depth], partial_grads=True)


def linear_pair(mesh, first: tuple[int, int], second: tuple[int, int], dtype) -> tuple[nn.Module, nn.Module]:
    """The two linear layers of attention or an MLP: column- then row-parallel (1-D), or SUMMA."""
    if mesh.layout.kind == "1d":
        return ColumnParallelLinear(*first, mesh, dtype=dtype), RowParallelLinear(*second, mesh, dtype=dtype)
    return Linear2p5D(*first, mesh, dtype=dtype), Linear2p5D(*second, mesh, dtype=dtype)


class LayerNorm2p5D(nn.Module):
    """LayerNorm over features split along the row: mean and variance from row sums (forward one
    all-reduce each, backward one each: each member's features use the replicated statistic)."""

    def __init__(self, dim: int, mesh, *, dtype: torch.dtype, eps: float = 1e-5):
        super().__init__()
        self.mesh, self.label, self.dim, self.eps = mesh, "", dim, eps
        self._held = held_whole(mesh, (dim // mesh.layout.q,))
        self.weight, self.bias = self._held.parameter(dtype), self._held.parameter(dtype)

    def _row_sum(self, x: torch.Tensor) -> torch.Tensor:
        row = self.mesh.row
        return copy_to(reduce_from(x.sum(-1, keepdim=True), row, self.label), row, self.label)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - self._row_sum(x) / self.dim
        variance = self._row_sum(centred * centred) / self.dim  # biased, as nn.LayerNorm
        y = centred * torch.rsqrt(variance + self.eps)
        return y * self._held.whole(self.weight, self.label) + self._held.whole(self.bias, self.label)


class LayerNorm1D(nn.Module):
    """nn.LayerNorm computed whole on every rank of a 1-D group, its weight and bias held split."""

    def __init__(self, dim: int, mesh, *, dtype: torch.dtype, eps: float = 1e-5):
        super().__init__()
        self.label, self.dim, self.eps = "", dim, eps
        self._held = held_whole(mesh, (dim,))
        self.weight, self.bias = self._held.parameter(dtype), self._held.parameter(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.dim,), self._held.whole(self.weight, self.label),
                            self._held.whole(self.bias, self.label), self.eps)


def layer_norm(dim: int, mesh, dtype) -> nn.Module:
    return LayerNorm1D(dim, mesh, dtype=dtype) if mesh.layout.kind == "1d" else LayerNorm2p5D(dim, mesh, dtype=dtype)


class ParallelAttention(nn.Module):
    """Causal self-attention with the heads split ``split_ways`` ways: ``qkv``'s output block holds
    this rank's heads of q, k and v (the dense rows permuted, see ``lm.qkv_rows``), ``out`` takes
    the same heads' outputs."""

    def __init__(self, dim: int, heads: int, mesh, dtype):
        super().__init__()
        self.local_heads = heads // split_ways(mesh)
        self.head_dim = dim // heads
        self.qkv, self.out = linear_pair(mesh, (dim, 3 * dim), (dim, dim), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.local_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, self.local_heads * self.head_dim))


class ParallelBlock(nn.Module):
    """Pre-norm block as :class:`~gradwire.tasks.models.TransformerBlock`."""

    def __init__(self, dim: int, heads: int, mesh, dtype):
        super().__init__()
        self.norm1 = layer_norm(dim, mesh, dtype)
        self.attention = ParallelAttention(dim, heads, mesh, dtype)
        self.norm2 = layer_norm(dim, mesh, dtype)
        fc1, fc2 = linear_pair(mesh, (dim, 4 * dim), (4 * dim, dim), dtype)
        self.mlp = nn.Sequential(fc1, nn.GELU(), fc2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mesh, total: int,
                                 label: str) -> torch.Tensor:
    """Σ over this rank's tokens of cross entropy / ``total``, from logits whose vocabulary is split
    along the row (block i): the row's max, sum of exponentials and target logit are all-reduced.
    The value is replicated over the row, and so is its gradient (reduce_from)."""
    row = mesh.row
    width = logits.shape[-1]
    peak = logits.detach().amax(-1, keepdim=True).contiguous()
    row.all_reduce(peak, label, op="max")  # any shift gives the same loss: no gradient
    shifted = logits - peak
    sum_exp = reduce_from(shifted.exp().sum(-1), row, label)
    local = targets - mesh.i * width
    mine = (local >= 0) & (local < width)
    picked = shifted.gather(-1, local.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1) * mine
    target_logit = reduce_from(picked, row, label)
    return (sum_exp.log() - target_logit).sum() / total


__all__ = ["LayerNorm1D", "LayerNorm2p5D", "ParallelAttention", "ParallelBlock", "held_whole", "layer_norm",
           "linear_pair", "sequence_block",
           "vocab_parallel_cross_entropy"]
