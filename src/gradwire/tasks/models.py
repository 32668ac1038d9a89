"""The tasks' models, initialised from an explicit generator only.

Constraints from the run loop, which calls models with ``torch.func.functional_call`` on a flat
parameter vector: no buffers (so no BatchNorm) and no dropout, so a forward pass is a pure,
deterministic function of (parameters, input).

Layers are created on the ``meta`` device and then materialised, so building a model never draws
from (or advances) torch's global RNG; :func:`init_from` then fills every weight and bias with
PyTorch's default distribution for Linear/Conv layers (kaiming_uniform with a=sqrt(5), i.e.
U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias), drawn from the generator.
All builders are module-level functions so that ``functools.partial`` of them pickles.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class AddChannel(nn.Module):
    """(B, L) -> (B, 1, L): a sequence of scalars as a one-channel signal for Conv1d."""

    def forward(self, x: Tensor) -> Tensor:
        return x.unsqueeze(1)


def init_from(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Draw every Linear/Conv1d weight and bias from ``generator`` in module order."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Conv1d)):
                bound = 1.0 / math.sqrt(m.weight[0].numel())  # fan_in = in_features * kernel_size
                m.weight.uniform_(-bound, bound, generator=generator)
                if m.bias is not None:
                    m.bias.uniform_(-bound, bound, generator=generator)
    return model


def on_cpu(model: nn.Module) -> nn.Module:
    """``model`` (built on the meta device) with uninitialised CPU parameters and buffers: what
    ``to_empty(device="cpu")`` does, without its ``empty_like`` of meta tensors, which goes through
    torch's Python references and imports sympy at its first use (seconds of every process's start,
    a restarted replica's included)."""
    made: dict[int, torch.Tensor] = {}  # (a tensor two modules share stays shared)
    for m in model.modules():
        for table in (m._parameters, m._buffers):
            for name, t in list(table.items()):
                if t is None:
                    continue
                if id(t) not in made:
                    new = torch.empty(tuple(t.shape), dtype=t.dtype)
                    made[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) \
                        else new
                table[name] = made[id(t)]
    return model


def _materialise(model: nn.Module, generator: torch.Generator) -> nn.Module:
    return init_from(on_cpu(model), generator)


def mlp(
    generator: torch.Generator, *, sizes: tuple[int, ...], dtype: torch.dtype, bias: bool = True
) -> nn.Module:
    """Linear layers of ``sizes`` (input, hidden..., output) with ReLU in between.

    ``sizes=(d, k)`` is (multinomial) logistic regression.
    """
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(a, b, bias=bias, device="meta", dtype=dtype))
    return _materialise(nn.Sequential(*layers), generator)


def mnist1d_cnn(generator: torch.Generator, *, dtype: torch.dtype, channels: int = 25, length: int = 40,
                num_classes: int = 10) -> nn.Module:
    """The CNN of the MNIST-1D paper (Greydanus, 2020, "Scaling down deep learning"): three strided
    Conv1d + ReLU layers (40 -> 19 -> 10 -> 5 positions) and a linear read-out of 25*5 = 125 features.
    """

    def conv(cin: int, k: int) -> nn.Conv1d:
        return nn.Conv1d(cin, channels, k, stride=2, padding=1, device="meta", dtype=dtype)

    out_len = length
    for k in (5, 3, 3):
        out_len = (out_len + 2 - k) // 2 + 1
    model = nn.Sequential(
        AddChannel(),
        conv(1, 5), nn.ReLU(),
        conv(channels, 3), nn.ReLU(),
        conv(channels, 3), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(channels * out_len, num_classes, device="meta", dtype=dtype),
    )
    return _materialise(model, generator)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position t sees positions <= t. The causal mask is
    computed by ``scaled_dot_product_attention(is_causal=True)``, not stored: FlatModel forbids
    buffers."""

    def __init__(self, dim: int, heads: int, dtype: torch.dtype):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, device="meta", dtype=dtype)
        self.out = nn.Linear(dim, dim, device="meta", dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, dim))


class TransformerBlock(nn.Module):
    """Pre-norm block (as GPT-2): x + attention(LN(x)), then x + MLP(LN(x)) with a 4x GELU MLP."""

    def __init__(self, dim: int, heads: int, dtype: torch.dtype):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, device="meta", dtype=dtype)
        self.attention = CausalSelfAttention(dim, heads, dtype)
        self.norm2 = nn.LayerNorm(dim, device="meta", dtype=dtype)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, device="meta", dtype=dtype), nn.GELU(),
                                 nn.Linear(4 * dim, dim, device="meta", dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    """A small decoder-only transformer language model: token and learnt position embeddings,
    ``layers`` pre-norm blocks, a final LayerNorm and a linear read-out to next-token logits.
    Input (batch, length) int64 tokens, output (batch, length, vocab) logits. No dropout and no
    buffers (the run loop's constraints, see the module docstring)."""

    def __init__(self, *, vocab: int, context: int, dim: int, layers: int, heads: int, dtype: torch.dtype):
        super().__init__()
        # (given its weight, Embedding skips its own N(0, 1) draw: on the meta device that draw goes
        # through torch's Python reference of normal_, whose first use imports torch._dynamo, seconds
        # of a replica's start; transformer_lm draws the weight itself)
        self.embed = nn.Embedding(vocab, dim, _weight=torch.empty(vocab, dim, device="meta", dtype=dtype))
        self.position = nn.Parameter(torch.empty(context, dim, device="meta", dtype=dtype))
        self.blocks = nn.Sequential(*(TransformerBlock(dim, heads, dtype) for _ in range(layers)))
        self.norm = nn.LayerNorm(dim, device="meta", dtype=dtype)
        self.head = nn.Linear(dim, vocab, device="meta", dtype=dtype)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(x)))


def transformer_lm(generator: torch.Generator, *, vocab: int, context: int, dim: int, layers: int, heads: int,
                   dtype: torch.dtype) -> nn.Module:
    """:class:`TransformerLM` drawn from ``generator``: Linear layers as :func:`init_from`, embeddings
    N(0, 0.02²) (GPT-2's), LayerNorms at weight 1 and bias 0."""
    model = TransformerLM(vocab=vocab, context=context, dim=dim, layers=layers, heads=heads,
                          dtype=dtype)
    model = on_cpu(model)
    with torch.no_grad():
        model.embed.weight.normal_(0.0, 0.02, generator=generator)
        model.position.normal_(0.0, 0.02, generator=generator)
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.zero_()
    return init_from(model, generator)
