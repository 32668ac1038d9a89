"""The byte-level transformer language model of ``stdlib-lm`` (:class:`~gradwire.tasks.models.TransformerLM`),
split over a tensor-parallel mesh, and the maps between its shards and the dense model.

The shard module has the dense module's parameter names, so :func:`shard_of` maps a dense
parameter to this rank's piece by name, and the same map applied to ``arange`` tensors gives the
indices that put the shards back together (:meth:`ParallelTransformerLM.dense_flat`). Every rank
draws the dense model from the run's seed and keeps its shard, so the tensor-parallel model starts
exactly where the dense one does (the whole model is in memory once, at build time).

1-D: embeddings, norms and the read-out are used whole on every rank; tokens and logits are the
whole batch. 2-D / 2.5-D: every parameter is split by features (embeddings by column, the read-out's
vocabulary along the row); the model takes the whole batch of its data-parallel group and works on
its own block of sequences (:func:`~gradwire.parallel.tp2p5d.sequence_block`). A tensor that
several ranks use whole is held split by rows over them (:func:`~gradwire.parallel.layers.held_whole`),
so :func:`shard_of` gives a rank its piece of it, and every element of the dense model is held
by exactly one rank of a tensor-parallel group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gradwire.parallel.comm import piece_rows
from gradwire.parallel.layers import ParallelBlock, held_whole, layer_norm, split_ways, vocab_parallel_cross_entropy
from gradwire.parallel.tp2p5d import Linear2p5D, sequence_block

LINEARS = ("attention.qkv", "attention.out", "mlp.0", "mlp.2", "head")


class Embedding(nn.Module):
    """An embedding table [rows, width] used whole (1-D: width = dim; SUMMA: feature block i, width
    dim/q, used whole over the column and the depth), held split (:func:`held_whole`)."""

    def __init__(self, rows: int, width: int, mesh, dtype):
        super().__init__()
        self.label = ""
        self._held = held_whole(mesh, (rows, width))
        self.weight = self._held.parameter(dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self._held.whole(self.weight, self.label))


class Readout1D(nn.Module):
    """1-D's read-out, nn.Linear(dim, vocab) computed whole on every rank, held split."""

    def __init__(self, dim: int, vocab: int, mesh, dtype):
        super().__init__()
        self.label = ""
        self._weight, self._bias = held_whole(mesh, (vocab, dim)), held_whole(mesh, (vocab,))
        self.weight, self.bias = self._weight.parameter(dtype), self._bias.parameter(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self._weight.whole(self.weight, self.label), self._bias.whole(self.bias, self.label))


class ParallelTransformerLM(nn.Module):
    """The shard of a :class:`~gradwire.tasks.models.TransformerLM` on this rank of ``mesh``."""

    def __init__(self, mesh, *, vocab: int, context: int, dim: int, layers: int, heads: int, dtype: torch.dtype):
        super().__init__()
        self.mesh, self.dim = mesh, dim
        summa = mesh.layout.summa
        width = dim // mesh.layout.q if summa else dim
        self.embed = Embedding(vocab, width, mesh, dtype)
        self._position = held_whole(mesh, (context, width))
        self.position = self._position.parameter(dtype)
        self.blocks = nn.Sequential(*(ParallelBlock(dim, heads, mesh, dtype) for _ in range(layers)))
        self.norm = layer_norm(dim, mesh, dtype)
        self.head = Linear2p5D(dim, vocab, mesh, dtype=dtype) if summa else Readout1D(dim, vocab, mesh, dtype)
        for name, module in self.named_modules():
            if hasattr(module, "label"):
                module.label = name

    def labels(self) -> list[str]:
        """Every label the model's collectives are counted under (ByteCounter): its layers' own, the
        position table's and, with SUMMA, the loss's; whatever the batch."""
        own = {module.label for module in self.modules() if hasattr(module, "label")}
        return sorted(own | {"position"} | ({"loss"} if self.mesh.layout.summa else set()))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.mesh.layout.summa:
            tokens = sequence_block(tokens, self.mesh)
        position = self._position.whole(self.position, "position")
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
        m = self.mesh
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(shard_of(name, params[name], m.layout, m.i, m.j, m.k))
        # every rank's flat shard size, for the evaluation's gather (the pieces differ by a row or so)
        self.shard_numels = [sum(shard_of(name, t, m.layout, *coordinates(m.layout, r)).numel()
                                 for name, t in params.items()) for r in range(m.layout.size)]
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
            at = 0
            for name, _ in self.named_parameters():  # every rank's parameters in this order, its own sizes
                shape = dense_params[name].shape
                index = shard_of(name, torch.arange(shape.numel(), device=out.device).view(shape), layout,
                                 *coordinates(layout, tp_rank))
                out[offsets[name] + index.reshape(-1)] = flat[at : at + index.numel()]
                at += index.numel()
        return out

    def gather_dense(self, flat: torch.Tensor, dense: nn.Module | None) -> torch.Tensor | None:
        """The dense flat parameters at the first rank of this tensor-parallel group (None at the
        others), gathered from every rank's flat shard ``flat``: what rank 0 evaluates. ``dense``
        (a TransformerLM: its names and shapes) is needed at that first rank only. Not counted in
        the run's bytes (as evaluation gathers are not)."""
        tp = self.mesh.tp
        if tp.size == 1:
            return self.dense_flat([flat], dense)
        padded = flat.new_zeros(max(self.shard_numels))  # the gather needs one size
        padded[: flat.numel()] = flat
        shards = tp.gather(padded, 0, label=None)  # evaluation: not counted
        if tp.index != 0:
            return None
        return self.dense_flat([s[:n] for s, n in zip(shards, self.shard_numels, strict=True)], dense)


def _part(length: int, n: int, index: int) -> torch.Tensor:
    return torch.arange(index * length // n, (index + 1) * length // n)


def qkv_rows(dim: int, n: int, index: int) -> torch.Tensor:
    """Output features of the fused q, k, v projection that hold heads block ``index`` of ``n``."""
    return torch.cat([t * dim + _part(dim, n, index) for t in range(3)])


def coordinates(layout, tp_rank: int) -> tuple[int, int, int]:
    """(i, j, k) of tensor-parallel rank ``tp_rank`` (1-D: i is the rank), as :class:`~gradwire.parallel.mesh.Mesh`."""
    if not layout.summa:
        return tp_rank, 0, 0
    q = layout.q
    return tp_rank % q, (tp_rank // q) % q, tp_rank // (q * q)


def _held(block: torch.Tensor, sizes: list[int], indices: list[int]) -> torch.Tensor:
    a, b = piece_rows(block.shape[0], sizes, indices)
    return block[a:b]


def shard_of(name: str, t: torch.Tensor, layout, i: int, j: int, k: int) -> torch.Tensor:
    """The piece of dense parameter ``name`` (value ``t``) that tensor-parallel rank (i, j, k) holds
    (1-D: i is the rank, j = k = 0). Linear weights come in nn.Linear's [out, in] layout; 1-D keeps
    it, SUMMA stores the [in/q, out/q] block of its transpose. A tensor that several ranks use whole
    is held as rows of it (:func:`~gradwire.parallel.layers.held_whole`): 1-D, split over the group;
    SUMMA, its feature block i split over the column and the depth, a weight block over the depth."""
    n = layout.p if layout.kind == "1d" else layout.q
    linear = next((x for x in LINEARS if name.endswith(x + ".weight") or name.endswith(x + ".bias")), None)

    def out_index(out_features: int) -> torch.Tensor:
        return qkv_rows(out_features // 3, n, i) if linear == "attention.qkv" else _part(out_features, n, i)

    if layout.kind == "1d":
        if linear in ("attention.qkv", "mlp.0"):  # column-parallel: rows of the weight, the bias
            return t[out_index(t.shape[0])]
        if linear in ("attention.out", "mlp.2") and name.endswith(".weight"):  # row-parallel
            return t[:, _part(t.shape[1], n, i)]
        return _held(t, [n], [i])  # used whole by every rank
    over_column_and_depth = ([layout.q, layout.d], [j, k])
    if linear is not None:
        if name.endswith(".bias"):
            return _held(t[out_index(t.shape[0])], *over_column_and_depth)
        return _held(t.T[_part(t.shape[1], n, j)][:, out_index(t.shape[0])], [layout.d], [k])
    if t.dim() == 2:  # embed.weight, position: [rows, dim]
        return _held(t[:, _part(t.shape[1], n, i)], *over_column_and_depth)
    return _held(t[_part(t.shape[0], n, i)], *over_column_and_depth)  # layer norms


def parallel_lm(mesh, dense: nn.Module) -> ParallelTransformerLM:
    """This rank's shard of ``dense`` (a :class:`~gradwire.tasks.models.TransformerLM`)."""
    blocks = list(dense.blocks)
    heads = blocks[0].attention.heads if blocks else split_ways(mesh)
    vocab, dim = dense.embed.weight.shape
    model = ParallelTransformerLM(mesh, vocab=vocab, context=dense.position.shape[0], dim=dim, layers=len(blocks),
                                  heads=heads, dtype=dense.embed.weight.dtype)
    return model.load_dense(dense)
