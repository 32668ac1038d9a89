"""Exact bytes of the tensor-parallel layers, per layer and per training step (forward + backward),
summed over every process of one tensor-parallel group, as the layers send them and
:mod:`gradwire.parallel.comm` counts them: each formula is a sum of the byte ledger's collectives
(transports/ledger.py: broadcast and reduce (g-1)·n, all-reduce 2·(g-1)·n).

``tokens`` is the number of tokens (sequences x length) that the group works on in a step,
``e`` the bytes per element. The tests check every counter against these; the benchmark and the
weak-scaling prediction use them. Derivations are in docs/tensor_parallel.md.
"""

from __future__ import annotations

from gradwire.transports.ledger import allreduce, broadcast


def held_1d(p: int, nbytes: int) -> int:
    """A tensor of ``nbytes`` that every rank of a 1-D group uses whole, held split over the group
    (parallel/comm.py's Partitioned): each piece broadcast to the others forward, (p-1)·n; its
    gradient is whole on every rank already, so nothing backward."""
    return broadcast(nbytes, p)


def column_parallel(p: int, tokens: int, in_features: int, e: int) -> int:
    """1-D column-parallel linear: its input gradient all-reduced backward (Megatron's f)."""
    return allreduce(tokens * in_features * e, p)


def row_parallel(p: int, tokens: int, out_features: int, e: int) -> int:
    """1-D row-parallel linear: its output all-reduced forward (Megatron's g); its bias's pieces are
    :func:`held_1d`."""
    return allreduce(tokens * out_features * e, p)


def summa_linear(q: int, d: int, tokens: int, in_features: int, out_features: int, e: int,
                 bias: bool = True) -> int:
    """2-D (d = 1) / 2.5-D linear: SUMMA in each depth layer, 3·(q-1)·(A + d·W) with A = tokens·in
    and W = in·out (forward: X along rows and W along columns, q steps; backward: the same two
    broadcasts plus two reduces); each weight block held split over depth, assembled forward and
    its gradient reduced to the pieces backward, 2·(d-1)·W; the bias, :func:`_held_over_column_and_depth`,
    2·(q·d-1)·out."""
    a, w = tokens * in_features * e, in_features * out_features * e
    total = 3 * (broadcast(a, q) + broadcast(d * w, q)) + 2 * broadcast(w, d)
    if bias:
        total += _held_over_column_and_depth(q, d, out_features * e)
    return total


def _held_over_column_and_depth(q: int, d: int, nbytes: int) -> int:
    """A tensor of ``nbytes`` in all (its q feature blocks together) whose every block is used whole
    by the q·d ranks of its column and depth and held split over them: forward, each depth layer's
    part assembled along the column ((q-1)·n over the q blocks), then the parts along the depth
    (q·(d-1)·n); backward, the gradient reduced the same way back to the pieces:
    2·(q·d-1)·n, as one all-reduce over the q·d ranks would send."""
    return 2 * (broadcast(nbytes, q) + q * broadcast(nbytes, d))


def summa_layer_norm(q: int, d: int, tokens: int, dim: int, e: int) -> int:
    """2-D / 2.5-D layer norm: two row sums (mean, variance) all-reduced forward and again backward,
    2·(q-1)·tokens each; weight and bias over column and depth."""
    return 4 * allreduce(tokens * e, q) + 2 * _held_over_column_and_depth(q, d, dim * e)


def summa_embedding(q: int, d: int, rows: int, dim: int, e: int) -> int:
    """2-D / 2.5-D embedding table [rows, dim] split by columns, over column and depth."""
    return _held_over_column_and_depth(q, d, rows * dim * e)


def summa_cross_entropy(q: int, d: int, tokens: int, e: int) -> int:
    """Vocabulary-parallel cross entropy: max, sum of exponentials and target logit all-reduced
    along each row (2·(q-1)·tokens each), and the loss value over the group (one element)."""
    return 3 * allreduce(tokens * e, q) + allreduce(e, q * q * d)


def lm_step_bytes(layout, *, batch: int, context: int, dim: int, layers: int, vocab: int, e: int) -> dict[str, int]:
    """Bytes of one training step of :class:`~gradwire.parallel.lm.ParallelTransformerLM` per label
    (the labels of the layers' counters), for one tensor-parallel group working on ``batch`` sequences."""
    t = batch * context
    out: dict[str, int] = {}
    if layout.kind == "1d":
        p = layout.p
        out["embed"] = held_1d(p, vocab * dim * e)
        out["position"] = held_1d(p, context * dim * e)
        norm = held_1d(p, 2 * dim * e)  # weight and bias
        for b in range(layers):
            out[f"blocks.{b}.norm1"] = norm
            out[f"blocks.{b}.attention.qkv"] = column_parallel(p, t, dim, e)
            out[f"blocks.{b}.attention.out"] = row_parallel(p, t, dim, e) + held_1d(p, dim * e)
            out[f"blocks.{b}.norm2"] = norm
            out[f"blocks.{b}.mlp.0"] = column_parallel(p, t, dim, e)
            out[f"blocks.{b}.mlp.2"] = row_parallel(p, t, dim, e) + held_1d(p, dim * e)
        out["norm"] = norm
        out["head"] = held_1d(p, (vocab * dim + vocab) * e)
        return {k: v for k, v in out.items() if v}
    q, d = layout.q, layout.d
    out["embed"] = summa_embedding(q, d, vocab, dim, e)
    out["position"] = summa_embedding(q, d, context, dim, e)
    for b in range(layers):
        out[f"blocks.{b}.norm1"] = summa_layer_norm(q, d, t, dim, e)
        out[f"blocks.{b}.attention.qkv"] = summa_linear(q, d, t, dim, 3 * dim, e)
        out[f"blocks.{b}.attention.out"] = summa_linear(q, d, t, dim, dim, e)
        out[f"blocks.{b}.norm2"] = summa_layer_norm(q, d, t, dim, e)
        out[f"blocks.{b}.mlp.0"] = summa_linear(q, d, t, dim, 4 * dim, e)
        out[f"blocks.{b}.mlp.2"] = summa_linear(q, d, t, 4 * dim, dim, e)
    out["norm"] = summa_layer_norm(q, d, t, dim, e)
    out["head"] = summa_linear(q, d, t, dim, vocab, e)
    out["loss"] = summa_cross_entropy(q, d, t, e)
    return {k: v for k, v in out.items() if v}
