"""A communication-bound language-model task on text that is always there: the Python standard
library's own source files.

``stdlib-lm`` reads the ``*.py`` files directly in ``sysconfig.get_paths()["stdlib"]`` in sorted
order (the same list on every process of a machine; another Python version has other files, hence
other numbers). Every tenth file (index 9, 19, ...)
is validation, the rest training: a split by file, so no validation window shares a file with
training. Tokens are bytes (vocabulary 256). Each file's bytes are concatenated in order and cut
into non-overlapping windows of ``context + 1`` bytes; a sample is the window's first ``context``
bytes and its targets are the same window shifted by one, so every position is trained
(next-token cross entropy, averaged over the positions and the batch).

Evaluation runs the model on every test sample and on ``train_loss``'s samples at every
evaluation step, so both are capped: ``val_bytes`` of the validation files, and ``train_loss`` is
measured on a fixed, evenly spaced subset of as many training windows (``Task.eval_train``).
``test_loss`` is the validation loss; ``test_acc`` the fraction of bytes predicted exactly.

With ``--tensor-parallel`` (docs/tensor_parallel.md) every process draws this same dense model and
keeps its shard of it (:func:`gradwire.parallel.lm.parallel_lm`), sized by the same spec keys
(:func:`transformer_sizes`). The model is :func:`~gradwire.tasks.models.transformer_lm`. Its
default (dim 192, 3 layers, 1.44M parameters, a 5.8 MB float32 gradient) makes communication
dominate at 100 Mbit/s; tests take ``dim=32,layers=1,context=16``.
"""

from __future__ import annotations

import sysconfig
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from gradwire.spec import require
from gradwire.tasks.base import TASKS, Task, TaskContext
from gradwire.tasks.models import transformer_lm

VOCAB = 256  # byte-level tokens


def stdlib_sources() -> list[Path]:
    """The standard library's top-level ``*.py`` files, sorted by name."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def _windows(files: list[Path], context: int, max_bytes: int) -> torch.Tensor:
    """Up to ``max_bytes`` of ``files`` in order, as (n, context + 1) uint8 windows."""
    data, total = [], 0
    for path in files:
        if total >= max_bytes:
            break
        chunk = path.read_bytes()[: max_bytes - total]
        data.append(chunk)
        total += len(chunk)
    raw = torch.frombuffer(bytearray(b"".join(data)), dtype=torch.uint8)
    n = len(raw) // (context + 1)
    return raw[: n * (context + 1)].view(n, context + 1)


def next_token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of (batch, length, vocab) logits against (batch, length) next tokens."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def transformer_sizes(spec: str) -> dict[str, int]:
    """vocab, context, dim, layers and heads of the transformer that task ``spec`` builds, read from the
    spec alone (no data read); ConfigError for a task without one (tensor parallelism splits it)."""
    from gradwire.errors import ConfigError

    entry, kwargs = TASKS.resolve(spec)
    if entry.name != "stdlib-lm":
        raise ConfigError(f"tensor parallelism splits a transformer, and task {spec!r} has none; use --task "
                          "stdlib-lm (e.g. stdlib-lm:dim=256,heads=8)")
    values = {name: kwargs.get(name, p.default) for name, p in entry.params.items()}
    return {"vocab": VOCAB} | {k: int(values[k]) for k in ("context", "dim", "layers", "heads")}


@TASKS.register("stdlib-lm", help="byte-level transformer language model on the Python standard library's sources "
                "(default 1.44M parameters; validation = every 10th file)",
                params={"context": "tokens (bytes) per sample",
                        "dim": "model width (divisible by heads)",
                        "layers": "transformer blocks",
                        "heads": "attention heads",
                        "train_bytes": "bytes of training text read (from the first training files on)",
                        "val_bytes": "bytes of validation text; train_loss uses as many training bytes"})
def stdlib_lm(*, context: int = 64, dim: int = 192, layers: int = 3, heads: int = 4, train_bytes: int = 2_000_000,
              val_bytes: int = 16_384, _ctx: TaskContext) -> Task | None:
    require(context >= 1, f"context must be >= 1, got {context}")
    require(dim >= 1 and heads >= 1 and dim % heads == 0,
            f"dim must be a positive multiple of heads={heads}, got dim={dim}")
    require(layers >= 0, f"layers must be >= 0, got {layers}")
    require(train_bytes >= context + 1 and val_bytes >= context + 1,
            f"train_bytes and val_bytes must each hold a sample of context+1={context + 1} bytes, got "
            f"{train_bytes} and {val_bytes}")
    if _ctx.check_only:
        return None
    files = stdlib_sources()
    require(len(files) >= 10, f"found {len(files)} *.py files in {sysconfig.get_paths()['stdlib']}, need 10")
    train = _windows([f for i, f in enumerate(files) if i % 10 != 9], context, train_bytes).long()
    val = _windows([f for i, f in enumerate(files) if i % 10 == 9], context, val_bytes).long()
    eval_train = torch.linspace(0, len(train) - 1, min(len(val), len(train))).round().long()
    model_fn = partial(transformer_lm, vocab=VOCAB, context=context, dim=dim, layers=layers, heads=heads,
                       dtype=_ctx.dtype)
    return Task(name="stdlib-lm", x_train=train[:, :-1].contiguous(), y_train=train[:, 1:].contiguous(),
                x_test=val[:, :-1].contiguous(), y_test=val[:, 1:].contiguous(), num_classes=VOCAB,
                model_fn=model_fn, loss_fn=next_token_cross_entropy, eval_train=eval_train)


# --lr left out is an algorithm's default_lr times this where --lr is a gradient step (tasks/base.py,
# default_lr_scale): plain SGD with momentum 0.9 on the transformer diverges for a few steps at sync's
# 0.8 and is unstable up to 0.1 (the loss jumps to 25-49 at 0.8, to 4.8 at 0.1); at 0.03 it learns
# steadily (1 worker, 60 steps: 5.66 -> 3.11; AdamW at 3e-3: 2.83). docs/defaults.md, "stdlib-lm".
stdlib_lm.default_lr_scale = 0.0375
