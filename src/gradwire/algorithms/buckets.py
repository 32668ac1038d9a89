"""Averaging a gradient bucket by bucket, while the backward pass computes the rest (``sync:overlap``).

The backward pass produces the last layers' gradients first. :class:`BucketPlan` groups the model's
tensors in that order (reverse parameter order) into buckets of about ``cap`` elements, as DDP
groups them (Li et al., VLDB 2020, "PyTorch Distributed", Sec. 3.2.3: gradient bucketing, and
overlapping the buckets' allreduces with the backward pass). :class:`BucketQueue` hears each tensor
finish (``FlatModel``'s ``on_ready``) and hands every complete bucket on, strictly in bucket order:
every worker then issues its collectives in the same order, whatever order its hooks fire in.

What a bucket's mean is does not depend on who computes it when: the algorithm calls the same
``Averager.mean_tensors`` per bucket on every backend. On a real backend (one worker per process) it
runs on a communication thread as the buckets complete, so the allreduces travel while the
backward pass goes on; on the simulator, which hosts every worker in one process, the buckets are
averaged one after another once every worker has computed (its clock charges computation and then
communication: it does not model the overlap).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class BucketPlan:
    """The model's tensors (``shapes``, in parameter order) grouped by index into buckets in reverse
    order, each of at most ``cap`` elements unless one tensor alone is larger."""

    def __init__(self, shapes: Sequence[Sequence[int]], cap: int):
        if cap < 1:
            raise ValueError(f"a bucket must hold at least one element, got cap={cap}")
        self.shapes = [torch.Size(s) for s in shapes]
        self.numels = [s.numel() for s in self.shapes]
        self.offsets = [0]
        for n in self.numels:
            self.offsets.append(self.offsets[-1] + n)
        self.buckets: list[list[int]] = []
        size = 0
        for index in reversed(range(len(self.numels))):
            if not self.buckets or size + self.numels[index] > cap:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(index)
            size += self.numels[index]
        for bucket in self.buckets:
            bucket.sort()  # within a bucket, in parameter order
        self.bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket}

    def views(self, flat: torch.Tensor, bucket: int) -> list[torch.Tensor]:
        """The bucket's tensors as views of a flat vector in parameter order."""
        return [flat[self.offsets[i]:self.offsets[i + 1]].view(self.shapes[i]) for i in self.buckets[bucket]]

    def assemble(self, means: Sequence[Sequence[torch.Tensor]], like: torch.Tensor) -> torch.Tensor:
        """One flat vector (parameter order) from every bucket's tensors (bucket order)."""
        out = torch.empty_like(like)
        for bucket, tensors in zip(self.buckets, means, strict=True):
            for i, t in zip(bucket, tensors, strict=True):
                out[self.offsets[i]:self.offsets[i + 1]] = t.reshape(-1)
        return out


class BucketQueue:
    """Collects one worker's gradient tensors as the backward pass announces them and calls
    ``submit(bucket, tensors)`` for each bucket once all its tensors are in, in bucket order."""

    def __init__(self, plan: BucketPlan, submit: Callable[[int, list[torch.Tensor]], None]):
        self.plan, self.submit = plan, submit
        self.tensors: dict[int, torch.Tensor] = {}
        self.missing = [len(b) for b in plan.buckets]
        self.next = 0

    def ready(self, index: int, grad: torch.Tensor) -> None:
        """Tensor ``index``'s gradient is complete (``FlatModel``'s ``on_ready``)."""
        if index in self.tensors:  # announced once per backward pass; a second time would be a bug
            raise RuntimeError(f"tensor {index}'s gradient was announced twice in one backward pass")
        self.tensors[index] = grad
        self.missing[self.plan.bucket_of[index]] -= 1
        while self.next < len(self.missing) and self.missing[self.next] == 0:
            self._hand_on(self.next)

    def flush(self, grad: torch.Tensor) -> None:
        """After the backward pass: hand on the buckets not handed on yet (tensors that got no
        gradient were never announced: their entries of ``grad``, zero, stand in)."""
        while self.next < len(self.missing):
            views = self.plan.views(grad, self.next)
            for i, view in zip(self.plan.buckets[self.next], views, strict=True):
                self.tensors.setdefault(i, view)
            self._hand_on(self.next)

    def _hand_on(self, bucket: int) -> None:
        self.next += 1
        self.submit(bucket, [self.tensors[i] for i in self.plan.buckets[bucket]])
