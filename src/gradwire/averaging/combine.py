"""How a compressed mean turns the decoded messages of an all-gather into one result.

The default is the plain mean, (1/R) Σ_r m_r over the R messages m_r (``CompressedMean.decode_mean``).
Sparse messages admit two other rules, which the SparseLoCo authors' trainer uses
(tplr-ai/templar at c2397ac, ``src/tplr/compress.py``, ``TopKCompressor.batch_decompress`` and
``decompress``; docs/low_communication.md describes it):

- ``clip="median_norm"``: before anything is added, each message's norm is cut to the median of the
  R messages' norms, per parameter tensor (``segments``: the tensors' sizes in the flat vector's
  order): m_r <- m_r · min(1, med / (‖m_r‖ + 1e-8)), med the lower median of ‖m_1‖..‖m_R‖ (the
  ⌈R/2⌉-th smallest, which ``torch.median`` returns for an even R). A worker whose message is
  larger than most cannot move the parameters further than a typical one.
- ``aggregate="senders_mean"``: each position is the mean over the workers whose message carries that
  position, Σ_r m_r[j] / |{r : j ∈ S_r}| (positions no one sent stay 0), where ``mean`` divides by
  R. A coordinate that only one worker kept moves R times as far as under the plain mean. It needs the
  positions each payload carries (``decode_sent`` of the compressor): a kept value that quantised to 0
  still counts as sent.

Neither changes the wire: the same payloads, the same bytes; only the receiving end's sum differs.
Stateless (its configuration is the algorithm's spec), so nothing enters a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gradwire.spec import require

AGGREGATES = ("mean", "senders_mean")
CLIPS = ("none", "median_norm")
CLIP_EPS = 1e-8  # added to a message's norm before dividing (as the authors' rule)


class MessageCombine:
    """``aggregate`` and ``clip`` (module docstring); ``segments``: the sizes of the pieces whose norms
    the clip takes (the model's tensors), summing to the length of every combined vector."""

    def __init__(self, *, aggregate: str = "mean", clip: str = "none", segments: Sequence[int] = ()):
        require(aggregate in AGGREGATES, f"aggregate={aggregate!r}: valid choices are {', '.join(AGGREGATES)}")
        require(clip in CLIPS, f"clip={clip!r}: valid choices are {', '.join(CLIPS)}")
        require(clip == "none" or len(segments) > 0, "clip=median_norm needs the tensors' sizes (segments)")
        self.aggregate, self.clip, self.segments = aggregate, clip, [int(s) for s in segments]

    @property
    def needs_positions(self) -> bool:
        return self.aggregate == "senders_mean"

    def __call__(self, messages: Sequence[torch.Tensor], sent: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """The combined result of the decoded ``messages`` (1-D, in rank order; ``sent``: their position
        masks, needed by ``senders_mean``). The inputs are not modified."""
        if self.clip == "median_norm":
            messages = self.clipped(messages)
        total = messages[0].clone()
        for m in messages[1:]:
            total += m
        if self.aggregate == "mean":
            return total.div_(len(messages))
        require(sent is not None, "aggregate=senders_mean needs each message's sent positions")
        senders = torch.zeros(total.shape, dtype=torch.int64, device=total.device)
        for s in sent:
            senders += s.reshape(total.shape)
        return total.div_(senders.clamp(min=1).to(total.dtype))

    def clipped(self, messages: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each message with the norm of each segment cut to the lower median of that segment's norms."""
        n = messages[0].numel()
        require(sum(self.segments) == n, f"clip=median_norm: the segments cover {sum(self.segments)} elements, "
                                         f"the messages have {n} (a fragment of the model is not supported)")
        out = [m.clone() for m in messages]
        start = 0
        for size in self.segments:
            stop = start + size
            norms = torch.stack([m[start:stop].norm() for m in messages])
            median = norms.sort().values[(len(messages) - 1) // 2]
            factors = (median / (norms + CLIP_EPS)).clamp(max=1)
            for m, f in zip(out, factors, strict=True):
                m[start:stop].mul_(f)
            start = stop
        return out
