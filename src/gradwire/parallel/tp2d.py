"""2-D tensor parallelism: SUMMA (van de Geijn and Watts 1997) as in Optimus (Xu et al. 2021).

On a q x q grid, rank (column i, row j) holds block [j, i] of the input X (tokens block j,
features block i) and of the weight W ([in/q, out/q] blocks), and computes block [j, i] of
Y = X W in q steps: at step t, X[j, t] is broadcast along row j and W[t, i] along column i, and
each rank adds their product. Backward, for each t:

* dX[j, t] = Σ_i dY[j, i] W[t, i]ᵀ: W[t, i] broadcast along column i, the partial products reduced
  along row j to rank (t, j);
* dW[t, i] = Σ_j X[j, t]ᵀ dY[j, i]: X[j, t] broadcast along row j, the partial products reduced
  along column i to rank (i, t).

Per layer and step, summed over the grid (A = tokens · in, W = in · out elements): forward
(q-1)·(A + W), backward 2·(q-1)·(A + W), i.e. 3·(q-1)·(A + W) in all. The backward broadcasts again
what the forward broadcast (as Colossal-AI's code does) instead of keeping q blocks per layer in
memory. 2.5-D runs this in every depth layer (:mod:`gradwire.parallel.tp2p5d`).
"""

from __future__ import annotations

import torch

from gradwire.parallel.comm import Group


class _Summa(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, row: Group, col: Group, label: str):
        x, w = x.contiguous(), w.contiguous()
        ctx.save_for_backward(x, w)
        ctx.row, ctx.col, ctx.label = row, col, label
        i, j = row.index, col.index
        out = x.new_zeros(x.shape[0], w.shape[1])
        for t in range(row.size):
            a = row.broadcast(x if i == t else torch.empty_like(x), t, label)  # X[j, t] from (t, j)
            b = col.broadcast(w if j == t else torch.empty_like(w), t, label)  # W[t, i] from (i, t)
            out.addmm_(a, b)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        row, col, label = ctx.row, ctx.col, ctx.label
        grad = grad.contiguous()
        i, j = row.index, col.index
        dx = dw = None
        for t in range(row.size):
            b = col.broadcast(w if j == t else torch.empty_like(w), t, label)  # W[t, i]
            part = row.reduce(grad @ b.T, t, label)  # Σ_i dY[j, i] W[t, i]ᵀ at (t, j)
            if i == t:
                dx = part
            a = row.broadcast(x if i == t else torch.empty_like(x), t, label)  # X[j, t]
            part = col.reduce(a.T @ grad, t, label)  # Σ_j X[j, t]ᵀ dY[j, i] at (i, t)
            if j == t:
                dw = part
        return dx, dw, None, None, None


def summa(x: torch.Tensor, w: torch.Tensor, row: Group, col: Group, label: str) -> torch.Tensor:
    """Block [j, i] of X W from blocks ``x`` = X[j, i] ([n, in/q]) and ``w`` = W[j, i] ([in/q,
    out/q]); ``row`` varies i, ``col`` varies j (see the module docstring)."""
    return _Summa.apply(x, w, row, col, label)
