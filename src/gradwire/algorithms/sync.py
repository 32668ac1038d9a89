"""Synchronous SGD with backup workers (Chen, Pan, Monga, Bengio, Jozefowicz 2016,
"Revisiting distributed synchronous SGD", Algorithm 2).

N + b workers compute a gradient at the same parameters; the first N to finish are averaged and
the b slowest are dropped, so a step lasts as long as the N-th order statistic of the compute
times (plus communication) instead of the maximum. b = 0 is plain synchronous SGD: one allreduce
(or allgather of compressed payloads) per step. With a compressor, each worker's gradient is
encoded (optionally with error feedback) and the payloads are decoded and averaged.

With b > 0 a server collects the gradients, as in the paper (``algorithms/protocol.py``): a worker
sends GRADIENT tagged with the step it computed for; the first N of step t are averaged and
applied, and each of them is answered PARAMS with x_{t+1}. A gradient that arrives for an earlier
step is late: counted in ``dropped``, never applied, and its worker is answered at once with the
current parameters, so a straggler skips ahead instead of replaying the steps it missed (nothing
cancels a computation under way: the late gradient is computed and sent in full, as on real
machines). Both backends run this protocol (``gradwire/servers/``).

Overlap (``overlap=auto``, the default): the gradient is averaged bucket by bucket as the
backward pass produces it (``algorithms/buckets.py``) wherever that gives the same numbers: on a
real backend (threads, torch: one worker per process) each bucket's allreduces travel on a
communication thread while the earlier layers' gradients are still being computed, as DDP overlaps
them. It is on when the compressor's mean can be taken bucket by bucket element for element
(``Averager.averages_buckets``: uncompressed, fp16 and bf16 without error feedback, PowerSGD) and
there are no backups; off for the others, which look at the whole gradient (top-k, random-k,
threshold, sign's scale, TernGrad's max, qsgd and pquant's blocks and random draws along the flat
vector, natural's draws) or keep one error-feedback residual for it, and off with backups (a
server collects whole gradients) and under tensor parallelism (the backward pass runs collectives
of its own). Each element's mean is summed in the same order as without overlap (tested equal to
the bit on the simulator and the threads backend, and on 2 gloo processes, where a sum of two is
the same in either order; gloo's ring allreduce over 3 or more ranks sums an element in an order
set by its place in the buffer, so there buckets can move the last bit, as DDP's own buckets do).
The simulator, which hosts every worker in one process and cannot overlap, averages the whole
gradient under ``auto`` (the same numbers; one collective's latency, not one per bucket);
``overlap=true`` runs the buckets there one after another, and insists (one clear line) where
the compressor cannot; ``overlap=false`` never overlaps. A step that stops mid-way (a signal, a
failed collective) cancels the buckets not yet started; ``close()`` ends the thread with the run.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch

from gradwire.algorithms.base import ALGORITHMS, Algorithm, make_averager, nested
from gradwire.algorithms.buckets import BucketPlan, BucketQueue
from gradwire.algorithms.optim import make_optimizer
from gradwire.algorithms.protocol import JOIN, PARAMS, Answer, GradientWorkers, Message, as_body
from gradwire.errors import CommunicationError, DivergenceError
from gradwire.spec import require

OVERLAP_CHOICES = ("auto", "true", "false")


@ALGORITHMS.register("sync", help="synchronous SGD; the b slowest workers of each step are dropped (Chen 2016)",
                     params={"backups": "number of backup workers b (gradients dropped per step)",
                             "overlap": "auto | true | false: average bucket by bucket during the backward "
                                        "pass. auto: wherever the numbers stay the same (real backends; "
                                        "none, fp16, bf16 without --error-feedback, powersgd; no backups); the "
                                        "other compressors need the whole gradient (a selection, a scale or "
                                        "random draws over all of it)",
                             "bucket_mb": "with overlap: gradient megabytes per bucket (the last layers' first)"})
class SyncSGD(Algorithm):
    name = "sync"
    scatters_mean = True  # without backups (set per instance in __init__)
    default_lr = 0.8  # --lr when not given (docs/defaults.md)
    default_compressor = "none"

    def __init__(self, *, backups: int = 0, overlap: str = "auto", bucket_mb: float = 1.0):
        require(backups >= 0, f"backups must be >= 0, got {backups}")
        require(math.isfinite(bucket_mb) and bucket_mb > 0, f"bucket_mb must be a number > 0, got {bucket_mb}")
        require(overlap in OVERLAP_CHOICES, f"overlap={overlap!r}: valid choices are {', '.join(OVERLAP_CHOICES)}")
        require(not (overlap == "true" and backups), "overlap=true needs backups=0: with backups a server collects "
                "whole gradients")
        self.backups, self.overlap, self.bucket_mb = backups, overlap, bucket_mb
        # --compressed-mean scatter routes the mean; not with backups, which gather the first n - b messages
        self.scatters_mean = backups == 0
        self.plan: BucketPlan | None = None
        self._thread: ThreadPoolExecutor | None = None

    def setup(self, ctx, params, optim, codec):
        super().setup(ctx, params, optim, codec)
        require(self.backups < ctx.world_size,
                f"backups={self.backups} leaves no worker to aggregate with {ctx.world_size} workers")
        # the parameters and optimizer every worker steps, or with backups the server's, which a process
        # that hosts only a worker does not hold (it computes at its own copy: GradientWorkers)
        self.serves = not self.needs_server or ctx.transport.holds_server
        self.x = params.clone() if self.serves else None
        self.opt = make_optimizer(self.x, optim) if self.serves else None
        self.averager = make_averager(ctx, codec, default=self.default_compressor, mean_only=not self.needs_server)
        if self.needs_server:
            self.need = ctx.world_size - self.backups
            self.current = 1     # the server's step in progress
            self.arrived: dict[int, tuple[torch.Tensor, float, int]] = {}  # its gradients so far
            self.late: list[int] = []
            self.workers = GradientWorkers(ctx.local_ranks, params, first_tag=1)  # tag: the step
        if self.overlap == "true":
            require(self.averager.averages_buckets(), f"overlap=true averages bucket by bucket, which --compressor "
                    f"{self.averager.spec()}{' with --error-feedback' if codec.error_feedback else ''} cannot (it "
                    f"compresses the whole gradient): use none, fp16, bf16 (without error feedback) or powersgd")
            require(bool(ctx.param_shapes), "overlap=true needs the model's tensor shapes")
        if self.overlap == "true" or (self.overlap == "auto" and self._overlap_is_exact(ctx)):
            cap = max(1, int(self.bucket_mb * 2**20 / params.element_size()))
            self.plan = BucketPlan(ctx.param_shapes, cap)

    @property
    def averages_during_backward(self) -> bool:
        """overlap=true: always (auto turns itself off where the backward pass runs collectives)."""
        return self.overlap == "true"

    def _overlap_is_exact(self, ctx) -> bool:
        """``overlap=auto``: overlap where it changes no number and something can overlap (one
        worker per process on a concurrent transport; module docstring)."""
        return (not self.needs_server and self.averager.averages_buckets() and bool(ctx.param_shapes)
                and ctx.transport.concurrent and len(ctx.local_ranks) == 1 and not ctx.backward_collectives)

    @property
    def needs_server(self) -> bool:
        """With backups a server takes the first N arrivals; plain sync needs none."""
        return self.backups > 0

    def compressor_spec(self):
        return self.averager.spec()

    def setup_info(self):
        return self.averager.setup_info()

    def aggregate(self, buffers: dict[int, torch.Tensor]) -> torch.Tensor:
        """Mean of the winners' decoded payloads, summed in rank order (as the collectives in
        ``step`` sum)."""
        return self.averager.decode_mean(buffers, self.x)

    # -- with backups: the server's protocol ----------------------------------------------------------

    def worker_step(self, ctx, rank, count):
        return self.workers.message(ctx, rank, count, self.averager)

    def _params(self, worker: int, step: int) -> Message:
        return Message(PARAMS, worker, tag=step, body=as_body(self.x))

    def on_message(self, msg, finished):
        if finished or msg.tag != self.current:  # late: never applied; catch up with x_t now
            if not finished:
                self.late.append(msg.worker)
            return Answer([self._params(msg.worker, self.current)], dropped=True)
        self.arrived[msg.worker] = (msg.body, msg.value, msg.count)
        if len(self.arrived) < self.need:
            return Answer()
        winners = sorted(self.arrived)
        self.opt.apply(self.aggregate({w: self.arrived[w][0] for w in winners}))
        info = {"loss": sum(self.arrived[w][1] for w in winners) / self.need, "gradients": self.need,
                "dropped": len(self.late), "winners": winners,
                "winner_counts": [self.arrived[w][2] for w in winners], "late": sorted(self.late)}
        self.current += 1
        replies = [self._params(w, self.current) for w in self.arrived]  # in arrival order
        self.arrived, self.late = {}, []
        return Answer(replies, info)

    def worker_apply(self, ctx, rank, reply):
        self.workers.apply(rank, reply)
        return None

    def join_reply(self, worker):
        return Message(JOIN, worker, tag=self.current, body=as_body(self.x))

    def min_workers(self):
        return self.backups + 1  # the b backups and at least one to aggregate

    def workers_needed(self):
        return self.need  # each step takes N gradients of different workers

    def step(self, ctx, step):  # b = 0 (with backups the server-mode driver runs the protocol above)
        ctx.compute_all(step)
        losses, grads = {}, {}
        if self.plan is not None and len(ctx.local_ranks) == 1 and ctx.transport.concurrent:
            (r,) = ctx.local_ranks
            losses[r], mean = self._overlapped(ctx, r, step)
        else:
            for r in ctx.local_ranks:
                losses[r], grads[r] = ctx.gradient(r, self.x)
            if self.plan is None:
                mean = self.averager.mean(ctx.transport, grads)
            else:  # the same buckets, one after another (the simulator: every worker in this process)
                means = [self.averager.mean_tensors(ctx.transport, {w: self.plan.views(g, b)
                                                                 for w, g in grads.items()}, bucket)
                         for b, bucket in enumerate(self.plan.buckets)]
                self.averager.end_step()
                mean = self.plan.assemble(means, self.x)
        self.opt.apply(mean)
        return {"loss": sum(losses.values()) / max(len(losses), 1), "gradients": ctx.world_size, "dropped": 0}

    def _overlapped(self, ctx, rank: int, step: int) -> tuple[float, torch.Tensor]:
        """This process's one worker computes its gradient while a communication thread averages the
        buckets the backward pass has finished, in bucket order."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gradwire-sync-rank{rank}")
        futures: list[Future] = []

        def submit(bucket: int, tensors: list[torch.Tensor]) -> None:
            futures.append(self._thread.submit(self.averager.mean_tensors, ctx.transport, {rank: tensors},
                                               self.plan.buckets[bucket]))

        queue = BucketQueue(self.plan, submit)
        try:
            try:
                loss, grad = ctx.gradient(rank, self.x, on_ready=queue.ready)
            except DivergenceError:
                # the other workers average the buckets announced so far with ours: finish them, then stop
                queue.flush(torch.zeros_like(self.x))
                self._results(ctx, futures)
                raise
            queue.flush(grad)
            mean = self.plan.assemble(self._results(ctx, futures), self.x)
        except BaseException:
            # stopped (a signal), or a collective failed: the buckets not yet started never will be,
            # so at most the one under way holds the communication thread, until its timeout
            for future in futures:
                future.cancel()
            raise
        self.averager.end_step()
        # a worker whose gradient was not finite stopped above; its NaN reached every mean
        if not math.isfinite(float(mean.sum())):
            raise DivergenceError(f"non-finite averaged gradient at step {step} on worker {rank} (another "
                                  "worker's gradient was not finite)", step=step, worker=rank)
        return loss, mean

    def close(self) -> None:
        """The communication thread ends: at once when idle, else when its collective returns."""
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None

    def _results(self, ctx, futures: list[Future]) -> list[list[torch.Tensor]]:
        """Every bucket's mean, waiting at most twice the transport's timeout for each (a bucket runs
        at most two collectives, each bounded by that timeout)."""
        limit = 2 * (ctx.transport.timeout_s or 120.0)
        out = []
        for b, future in enumerate(futures):
            try:
                out.append(future.result(timeout=limit))
            except FutureTimeout:
                raise CommunicationError(f"sync:overlap: bucket {b}'s mean did not finish within {limit:g} s") from None
        return out

    def eval_params(self):
        return self.x

    def per_worker_state(self) -> tuple[str, ...]:
        return nested("codec", self.averager)

    def state_dict(self):
        state = {"codec": self.averager.state_dict()}
        if self.serves:
            state |= {"x": self.x, "opt": self.opt.state_dict()}
        if self.needs_server:
            state["server"] = {"current": self.current, "late": list(self.late),
                               "arrived": [{"worker": w, "body": b, "loss": torch.tensor(loss, dtype=torch.float64),
                                            "count": c}
                                           for w, (b, loss, c) in self.arrived.items()],
                               "workers": self.workers.state_dict()}
        return state

    def load_state_dict(self, state):
        if self.serves:
            self.x.copy_(state["x"])
            self.opt.load_state_dict(state["opt"])
        self.averager.load_state_dict(state["codec"])
        if self.needs_server:
            s = state["server"]
            self.current, self.late = int(s["current"]), [int(w) for w in s["late"]]
            self.arrived = {int(e["worker"]): (e["body"].clone(), float(e["loss"]), int(e["count"]))
                            for e in s["arrived"]}
            self.workers.load_state_dict(s["workers"])


@ALGORITHMS.register("dqgd", help="quantized gradient descent without memory (Khirirat 2018): the baseline DIANA fixes",
                     params={})
class DQGD(SyncSGD):
    """x <- x - γ (1/n) Σ_i Q(∇f_i(x)) (Khirirat, Feyzmahdavian, Johansson 2018, eq. (5)).

    With heterogeneous workers ∇f_i(x*) ≠ 0, so the quantization variance ω||∇f_i(x*)||² does
    not vanish at the optimum and the iterates stall at a noise floor proportional to γ."""

    name = "dqgd"
    # DIANA's quantizer in 32-element blocks (docs/defaults.md: 64, DIANA's, and 512 learned less on mnist1d-mlp)
    default_compressor = "pquant:p=inf,block=32"
    default_lr = 0.6  # --lr when not given (docs/defaults.md): 1.2 on mnist1d-mlp; 0.8 ends at chance on the CNN

    def __init__(self):
        super().__init__(backups=0)


