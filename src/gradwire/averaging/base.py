"""The averager contract: the mean over the participants of one tensor per local worker.

An algorithm hands an averager its workers' tensors (flat vectors, keyed by worker rank) and a
transport; the averager puts what it chooses on the wire (real buffers, counted by the transport)
and gives back the mean that every participant receives, the same at each. How it gets there is its
own business: a compressed mean encodes each tensor to bytes and averages the decoded payloads
(averaging/compressed.py); PowerSGD averages low-rank factors by allreduce (averaging/powersgd.py).
:func:`gradwire.averaging.build_averager` is the one place that chooses between them.

Everything an averager remembers across steps (error-feedback residuals, random streams, PowerSGD's
warm starts) is in its ``state_dict()``, which a checkpoint holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch

from gradwire.transports.base import Handle, Transport


class Averager(ABC):
    """The mean over the participants. ``mean`` blocks; ``start`` returns a :class:`Handle` whose
    ``wait()`` gives the mean, so that the caller computes while it travels (on transports that
    overlap; elsewhere ``start`` is ``mean``).

    What a caller that runs collectives itself (a parameter server, the DDP hook) needs to know is
    declared here, so that it never asks which kind it holds:"""

    #: True: the mean is of one byte payload per participant (``encode``/``payloads``, then
    #: ``decode_mean``), which a caller may carry itself. False: the averager issues its own
    #: collectives, with computation between them (PowerSGD's two allreduces), through the
    #: ``allreduce_mean`` that :meth:`mean_tensors_by` is handed.
    carries_payloads = True
    #: Its state holds means of earlier steps (PowerSGD's Q), so that one non-finite mean would
    #: poison every later step: a caller must stop on it, not let it through (the hook's "propagate").
    remembers_means = False

    @abstractmethod
    def spec(self) -> str:
        """The spec string that builds this averager (what runs, defaults filled in)."""

    @abstractmethod
    def mean(self, transport: Transport, tensors: dict[int, torch.Tensor], ranks=None) -> torch.Tensor:
        """Mean over the participants (``ranks``; every worker when None) of their ``tensors``."""

    def start(self, transport: Transport, tensors: dict[int, torch.Tensor], ranks=None) -> Handle:
        """Start :meth:`mean` without blocking. This default runs it at once (nothing overlaps)."""
        return Handle(self.mean(transport, tensors, ranks))

    def averages_buckets(self) -> bool:
        """Whether :meth:`mean_tensors` works: the mean can be taken a few tensors at a time."""
        return False

    def mean_tensors(self, transport: Transport, tensors: dict[int, Sequence[torch.Tensor]],
                     indices: Sequence[int]) -> list[torch.Tensor]:
        """Mean over every worker of some of the model's tensors (``indices``, in parameter order;
        each local worker's tensors in that order): a bucket of ``sync:overlap``, which calls
        :meth:`end_step` once every bucket of a step is done."""
        raise ValueError(f"--compressor {self.spec()} compresses the whole gradient at once; only the "
                         "uncompressed mean and powersgd average bucket by bucket")

    def mean_tensors_by(self, allreduce_mean: Callable[[dict[int, torch.Tensor]], torch.Tensor],
                        tensors: dict[int, Sequence[torch.Tensor]], indices: Sequence[int]) -> list[torch.Tensor]:
        """:meth:`mean_tensors` through ``allreduce_mean`` (one flat tensor per local worker in, their
        mean over every worker out) instead of a transport: for an averager that does not
        :attr:`carry payloads <carries_payloads>`, whose caller runs the collectives (the DDP hook)."""
        raise ValueError(f"--compressor {self.spec()} has payloads for its caller to carry, not collectives of its own")

    def end_step(self) -> None:  # noqa: B027 - only an averager that counts steps has something to do
        """A step averaged bucket by bucket (:meth:`mean_tensors`) is over."""

    def set_step(self, step: int) -> None:  # noqa: B027 - only an averager that counts steps has something to do
        """The step the next means belong to, for a caller that counts steps itself (the DDP hook)."""

    def setup_info(self) -> dict:
        """What averaging does to this model, for algorithm.json (none by default)."""
        return {}

    def per_worker_state(self) -> tuple[str, ...]:
        """The paths (``a/b``) in :meth:`state_dict` of the dicts that hold one entry per local
        worker, keyed by its rank (its generator, its residual): see ``Algorithm.per_worker_state``."""
        return ()

    @abstractmethod
    def state_dict(self) -> dict: ...

    @abstractmethod
    def load_state_dict(self, state: dict) -> None: ...


class Finished(Handle):
    """A collective in flight whose result ``finish`` turns into what the caller wants (once)."""

    def __init__(self, inner: Handle, finish: Callable):
        super().__init__(None, inner.finish_s)
        self.inner, self.finish, self.done = inner, finish, False

    def wait(self) -> torch.Tensor:
        if not self.done:
            self._result, self.done = self.finish(self.inner.wait()), True
        return self._result

    def reschedule(self, finish_s: float) -> None:
        super().reschedule(finish_s)
        self.inner.reschedule(finish_s)
