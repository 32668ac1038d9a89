"""The byte-level transformer language model of ``stdlib-lm`` (:class:`~gradwire.tasks.models.TransformerLM`),
split over a tensor-parallel mesh, and the maps between its shards and the dense model.

The shard module has the dense module's parameter names, so :func:`shard_of` maps a dense
parameter to this rank's piece by name, and the same map applied to ``arange`` tensors gives the
indices that put the shards back together (:meth:`ParallelTransformerLM.dense_flat`). Every rank
draws the dense model from the run's seed and keeps its shard, so the tensor-parallel model starts
exactly where the dense one does (the whole model is in memory once, at build time).

1-D: embeddings, norms and the read-out are replicated; tokens and logits are the whole batch.
2-D / 2.5-D: every parameter is split by features (embeddings by column, the read-out's
vocabulary along the row); the model takes the whole batch of its data-parallel group and works on
its own block of sequences (:func:`~gradwire.parallel.tp2p5d.sequence_block`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gradwire.parallel.comm import replicated
from gradwire.parallel.layers import ParallelBlock, layer_norm, split_ways, vocab_parallel_cross_entropy
from gradwire.parallel.tp2p5d import Linear2p5D, sequence_block

LINEARS = ("attention.qkv", "attention.out", "mlp.0", "mlp.2", "head")


class SplitEmbedding(nn.Module):
    """An embedding table split by features (block i), replicated over the column and the depth."""

    def __init__(self, rows: int, dim: int, mesh, dtype):
        super().__init__()
        self.mesh, self.label = mesh, ""
        self.weight = nn.Parameter(torch.empty(rows, dim // mesh.layout.q, dtype=dtype))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, replicated(self.weight, [self.mesh.col, self.mesh.depth], self.label))


class ParallelTransformerLM(nn.Module):
    """The shard of a :class:`~gradwire.tasks.models.TransformerLM` on this rank of ``mesh``."""

    def __init__(self, mesh, *, vocab: int, context: int, dim: int, layers: int, heads: int, dtype: torch.dtype):
        super().__init__()
        self.mesh, self.dim = mesh, dim
        summa = mesh.layout.summa
        if summa:
            self.embed = SplitEmbedding(vocab, dim, mesh, dtype)
            self.position = nn.Parameter(torch.empty(context, dim // mesh.layout.q, dtype=dtype))
        else:
            self.embed = nn.Embedding(vocab, dim, dtype=dtype)
            self.position = nn.Parameter(torch.empty(context, dim, dtype=dtype))
        self.blocks = nn.Sequential(*(ParallelBlock(dim, heads, mesh, dtype) for _ in range(layers)))
        self.norm = layer_norm(dim, mesh, dtype)
        self.head = Linear2p5D(dim, vocab, mesh, dtype=dtype) if summa else nn.Linear(dim, vocab, dtype=dtype)
        for name, module in self.named_modules():
            if hasattr(module, "label"):
                module.label = name

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        m = self.mesh
        if m.layout.summa:
            tokens = sequence_block(tokens, m)
            position = replicated(self.position, [m.col, m.depth], "position")
        else:
            position = self.position
        x = self.embed(tokens) + position[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(x)))

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross entropy over the whole batch ``targets``. 1-D: the logits are whole.
        SUMMA: this rank's part (its sequences, its vocabulary block), whose gradient is this rank's
        share; its value is made the whole loss (an all-reduce of the detached parts, counted
        under ``loss``)."""
        m = self.mesh
        if not m.layout.summa:
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        part = vocab_parallel_cross_entropy(logits, sequence_block(targets, m), m, targets.numel(), "loss")
        whole = (part.detach() / m.layout.q).reshape(1)  # the row holds q copies of the part
        m.tp.all_reduce(whole, "loss")
        return part + (whole[0] - part.detach())

    def load_dense(self, dense: nn.Module) -> ParallelTransformerLM:
        """Copy this rank's shard of every parameter of ``dense`` (a TransformerLM)."""
        params = dict(dense.named_parameters())
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(shard_of(name, params[name], self.mesh.layout, self.mesh.i, self.mesh.j))
        return self

    def dense_flat(self, shards: list[torch.Tensor], dense: nn.Module) -> torch.Tensor:
        """The dense model's flat parameter vector (``dense``'s parameter order) from every
        tensor-parallel rank's flat shard, in tp-rank order."""
        layout = self.mesh.layout
        dense_params = dict(dense.named_parameters())
        offsets, start = {}, 0
        for name, p in dense_params.items():
            offsets[name] = start
            start += p.numel()
        out = shards[0].new_zeros(start)
        for tp_rank, flat in enumerate(shards):
            i, j = (tp_rank % layout.q, (tp_rank // layout.q) % layout.q) if layout.summa else (tp_rank, 0)
            at = 0
            for name, p in self.named_parameters():
                shape = dense_params[name].shape
                index = shard_of(name, torch.arange(shape.numel(), device=out.device).view(shape), layout, i, j)
                out[offsets[name] + index.reshape(-1)] = flat[at : at + p.numel()]
                at += p.numel()
        return out

    def gather_dense(self, flat: torch.Tensor, dense: nn.Module | None) -> torch.Tensor | None:
        """The dense flat parameters at the first rank of this tensor-parallel group (None at the
        others), gathered from every rank's flat shard ``flat``: what rank 0 evaluates. ``dense``
        (a TransformerLM: its names and shapes) is needed at that first rank only. Not counted in
        the run's bytes (as evaluation gathers are not)."""
        tp = self.mesh.tp
        if tp.size == 1:
            return self.dense_flat([flat], dense)
        shards = tp.gather(flat.contiguous(), 0, label=None)  # evaluation: not counted
        return self.dense_flat(shards, dense) if tp.index == 0 else None


def _part(length: int, n: int, index: int) -> torch.Tensor:
    return torch.arange(index * length // n, (index + 1) * length // n)


def qkv_rows(dim: int, n: int, index: int) -> torch.Tensor:
    """Output features of the fused q, k, v projection that hold heads block ``index`` of ``n``."""
    return torch.cat([t * dim + _part(dim, n, index) for t in range(3)])


def shard_of(name: str, t: torch.Tensor, layout, i: int, j: int) -> torch.Tensor:
    """The piece of dense parameter ``name`` (value ``t``) that tensor-parallel rank (i, j) holds
    (1-D: i is the rank). Linear weights come in nn.Linear's [out, in] layout; 1-D keeps it, SUMMA
    stores the [in/q, out/q] block of its transpose."""
    n = layout.p if layout.kind == "1d" else layout.q
    linear = next((x for x in LINEARS if name.endswith(x + ".weight") or name.endswith(x + ".bias")), None)

    def out_index(out_features: int) -> torch.Tensor:
        return qkv_rows(out_features // 3, n, i) if linear == "attention.qkv" else _part(out_features, n, i)

    if layout.kind == "1d":
        if linear in ("attention.qkv", "mlp.0"):  # column-parallel: rows of the weight, the bias
            return t[out_index(t.shape[0])]
        if linear in ("attention.out", "mlp.2") and name.endswith(".weight"):  # row-parallel
            return t[:, _part(t.shape[1], n, i)]
        return t  # replicated
    if linear is not None:
        if name.endswith(".bias"):
            return t[out_index(t.shape[0])]
        return t.T[_part(t.shape[1], n, j)][:, out_index(t.shape[0])]
    if t.dim() == 2:  # embed.weight, position: [rows, dim]
        return t[:, _part(t.shape[1], n, i)]
    return t[_part(t.shape[0], n, i)]  # layer norms


def parallel_lm(mesh, dense: nn.Module) -> ParallelTransformerLM:
    """This rank's shard of ``dense`` (a :class:`~gradwire.tasks.models.TransformerLM`)."""
    blocks = list(dense.blocks)
    heads = blocks[0].attention.heads if blocks else split_ways(mesh)
    vocab, dim = dense.embed.weight.shape
    model = ParallelTransformerLM(mesh, vocab=vocab, context=dense.position.shape[0], dim=dim, layers=len(blocks),
                                  heads=heads, dtype=dense.embed.weight.dtype)
    return model.load_dense(dense)
