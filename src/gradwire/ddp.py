"""Any gradwire compressor inside an unchanged DistributedDataParallel script.

:func:`register` installs a DDP communication hook (PyTorch docs, "DDP Communication Hooks";
``DistributedDataParallel.register_comm_hook``) that sends every gradient bucket through a
gradwire compressor. The whole integration is a three-line diff::

      model = DistributedDataParallel(model)
    + hook_state = gradwire.ddp.register(model, "qsgd:levels=4", error_feedback=True)
    + hook_state.load_state_dict(torch.load(f"hook-{rank}.pt", weights_only=True))  # on resume only
      ...  # the training loop is unchanged
    + torch.save(hook_state.state_dict(), f"hook-{rank}.pt")  # beside the model checkpoint

or, in PyTorch's own style, ``model.register_comm_hook(HookState(model, "fp16"), gradwire.ddp.hook)``.

Summable codecs (``none``, ``fp16``, ``bf16``) are one asynchronous allreduce of the bucket,
like DDP's own. Every other codec is encoded parameter by parameter and its ``uint8`` payloads
are all-gathered, decoded, and averaged in rank order, so that every rank applies bit-identical
gradients. Fixed-size codecs (qsgd, terngrad, pquant, sign, natural, randk) know every rank's
sizes in advance: one asynchronous all-gather, decoded when it completes (the future's
callback), nothing waited for in the hook. topk's size depends on the data within a bound (k
values, at most the largest section of k positions): its payloads travel framed at that bound
(``compress/wire.py``'s ``frame``) on the same asynchronous path. threshold's size has no bound:
it exchanges the sizes first and waits for both gathers.

``powersgd:rank=R`` (``gradwire.averaging.powersgd``, Vogels, Karimireddy, Jaggi 2019) is a third
path: each parameter's gradient through the same :meth:`PowerSGD.average` that the algorithms use,
its two allreduces (the Ps with the uncompressed tensors, then the Qs) run by ``dist.all_reduce`` on
one communication thread per process, so the backward pass goes on meanwhile.

The unit of compression is the *parameter*, not the bucket: DDP rebuilds its buckets after the
first iteration (in gradient-ready order, reversed with respect to the first), and a resumed run
starts again from the first layout, so residuals keyed by bucket index stop matching their
tensors (the problem PyTorch met with PowerSGD, pytorch/pytorch#48757 and #50981). Keyed by
parameter name, residuals, random draws and results do not depend on how DDP groups parameters.
"""

# No ``from __future__ import annotations``: DDP's register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] as objects, and strings fail that check.

import math
import numbers
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gradwire.averaging import build_averager, build_method
from gradwire.compress import Compressor, Packet, build
from gradwire.compress.wire import FRAME_BYTES, frame, unframe, work_dtype
from gradwire.errors import CommunicationError, ConfigError, DivergenceError
from gradwire.seeding import hash_seed
from gradwire.spec import parse_spec
from gradwire.transports import ledger

_RAW = build("none")  # small parameters travel as they are (see _allgather)

NON_FINITE = ("raise", "propagate")  # what the hook does with a gradient its codec refuses

STATE_KEYS = ("compressor", "error_feedback", "seed", "rank", "world_size", "step", "bytes_sent",
              "wire_bytes_sent", "residuals")
# saved since it was checked on load; a state saved before lacks it and loads as before
OPTIONAL_STATE_KEYS = ("min_compress_numel",)


class HookState:
    """Everything the hook remembers; ``state_dict()`` belongs in each rank's checkpoint.

    Tuning guide:

    * ``compressor``: a spec string (see ``gradwire list``) or a Compressor. ``fp16``/``bf16`` halve
      the bytes and keep DDP's allreduce; ``qsgd:levels=4`` sends ~4.1 bits per element and is
      unbiased, the safe lossy default; ``topk:ratio=0.01`` sends ~1% of the elements (values and
      positions) and needs ``error_feedback=True`` to converge like SGD (Stich, Cordonnier, Jaggi
      2018). Lossy codecs pay an encode, ``world_size`` decodes and a gather, which only wins where
      the network, not the CPU, is the bottleneck (see docs/ddp.md for measured step times).
    * ``error_feedback``: keep what compression dropped, per parameter, and add it to the next
      gradient (Seide et al. 2014). Required for biased codecs (``topk``, ``threshold``, ``sign``);
      a small gain for unbiased ones; residuals cost a float32 copy of the compressed parameters.
      Refused (ConfigError), like PowerSGD's own error memory, with DDP's
      ``find_unused_parameters=True`` without ``static_graph``: DDP never applies what the hook
      averaged for a parameter that no rank used in a step, so its residual would lose it.
    * ``seed``: random draws depend on (seed, rank, step, parameter index) only, so a run and its
      resumption draw the same numbers (a loaded state brings its run's seed and step).
    * ``timeout_s``: how long the sizes-first path (threshold) and PowerSGD's communication thread
      wait for each collective before raising :class:`~gradwire.errors.CommunicationError` (default:
      gloo's own 30 minutes; lower it to fail fast); a shorter process group timeout fires first, and
      the error names the limit that applied. The asynchronous paths (the summable casts, and the
      fixed-size codecs) wait nowhere in the hook, like DDP's own allreduce, and are bounded by the
      process group's timeout (``init_process_group(timeout=...)``).
    * ``powersgd:rank=R`` (its own error feedback, on by default; ``error_feedback=True`` adds
      nothing, and contradicts ``powersgd:error_feedback=false``): rank-R approximations of the
      weight matrices by two allreduces, vectors and small matrices uncompressed (its
      ``min_compression_rate``; ``min_compress_numel`` does not apply). The bytes per rank stay
      the same as ranks are added. Its Q memories and errors are kept per parameter name in
      ``state_dict()["powersgd"]``. ``powersgd:rank=R,dtype=fp16`` (or ``bf16``) sends the factors
      in half the bytes. The buckets run on one communication thread per process, so the hook
      returns at once and the backward pass goes on while they travel. Under DDP's
      ``find_unused_parameters=True`` (which needs ``powersgd:...,error_feedback=false``, above) the
      last bucket's hook waits for the thread, so that DDP's own allreduce comes after the hook's
      collectives on every rank.
    * ``non_finite``: what happens when a rank's codec refuses its gradient (a NaN or inf, or a
      value beyond fp16's range). ``"raise"`` (default): every rank raises DivergenceError naming
      the bucket and parameter. ``"propagate"``: every rank gets NaN for that bucket and training
      goes on, which is what mixed precision's ``torch.amp.GradScaler`` expects: it sees the
      overflow, skips the step and lowers its scale. Residuals are left as they were: what the
      skipped step changed in them is put back, on every rank. Not with ``powersgd`` (its Q
      memories would keep the NaN). With either, a summable cast's mean beyond its range (two fp16
      shares whose sum overflows) is not finite: raised as DivergenceError, or propagated.
    * ``grad_scaler``: the ``torch.amp.GradScaler`` that scales the loss, if any, so that residuals
      (error feedback) are kept unscaled: multiplied by the step's scale when added to a gradient,
      what is left divided by it (the scale read once per step). Without it a change of scale adds
      the residuals at the wrong scale. Not with ``powersgd`` (its error memory is its own).
    * ``min_compress_numel``: lossy codecs only. Parameters with fewer elements (biases, norms) travel
      uncompressed, all of a bucket's in one packet: a codec call has a fixed cost of a few tenths
      of a millisecond, which for a bias buys nothing (PowerSGD likewise leaves vectors alone,
      Vogels, Karimireddy, Jaggi 2019). 0 compresses everything.
    * Buckets: DDP's ``bucket_cap_mb`` changes how many collectives run per step, never what is
      computed. Larger buckets mean fewer, larger all-gathers.

    Byte counters (``bytes_sent``, ``wire_bytes_sent``) count what this rank contributed times the
    ``world_size - 1`` peers it reaches (the byte ledger's broadcast of it, transports/ledger.py),
    whatever algorithm the backend uses (a ring allreduce moves about twice that in total).
    ``bytes_sent`` counts compressor payloads only: the exact ``Packet.nbytes`` of every packet.
    ``wire_bytes_sent`` adds what the compressed path really hands to the all-gathers: a status
    byte per bucket on the asynchronous path, topk's frames (a 4-byte length and padding to its
    bound), and on threshold's path an int64 size per parameter and padding to the longest rank.

    ``state_dict()`` holds ints, strings and tensors (``torch.load(weights_only=True)`` reads it),
    never the process group. Residuals belong to one rank's data: every rank saves its own.
    """

    __slots__ = ("averager", "compressor", "error_feedback", "process_group", "rank", "world_size", "seed",
                 "generator", "timeout_s", "min_compress_numel", "step", "bytes_sent", "wire_bytes_sent",
                 "device", "non_finite", "path", "reciprocal", "_params", "_shapes", "_thread", "_passes",
                 "_failed_pass", "grad_scaler", "_scale", "_scale_pass", "_wait_last", "_before",
                 "_before_pass", "_skipped_pass")

    def __init__(self, model: torch.nn.Module, compressor: str | Compressor = "none", *,
                 error_feedback: bool = False, seed: int = 0, process_group=None,
                 timeout_s: float = 1800.0, min_compress_numel: int = 1024, non_finite: str = "raise",
                 grad_scaler: torch.amp.GradScaler | None = None):
        _check_settings(compressor, error_feedback, seed, timeout_s, min_compress_numel, non_finite, grad_scaler)
        self.non_finite = non_finite
        # an unknown name: one error listing compressors and averagers; a Compressor: its spec
        spec = build_method(compressor).spec() if isinstance(compressor, str) else compressor.spec()
        # the settings are checked before the process group is asked for (refused below without one)
        grouped = dist.is_available() and dist.is_initialized()
        self.process_group = process_group
        self.rank = dist.get_rank(process_group) if grouped else 0
        self.world_size = dist.get_world_size(process_group) if grouped else 1
        self.seed, self.timeout_s = int(seed), float(timeout_s)
        self.min_compress_numel = int(min_compress_numel)
        self.step = self.bytes_sent = self.wire_bytes_sent = 0
        module = model.module if isinstance(model, DistributedDataParallel) else model
        devices = {p.device for p in module.parameters()}
        if len(devices) != 1:  # DDP itself wants one device per process
            raise ConfigError(f"gradwire.ddp: the model's parameters are on {sorted(map(str, devices))}; "
                              "the hook compresses one device's gradients per process")
        # where the codecs run and the payloads live: the gradients' device (NCCL sends CUDA buffers)
        self.device = devices.pop()
        self.generator = torch.Generator(device=self.device)  # re-seeded per (step, parameter): see _encode
        named = list(module.named_parameters())
        # id(parameter) -> (index, name, numel): bucket.parameters() returns the module's own tensors
        self._params = {id(p): (i, name, p.numel()) for i, (name, p) in enumerate(named)}
        self._shapes = {name: p.shape for name, p in named}
        # The factory the run's algorithms use: memory keyed by parameter name (DDP's buckets change)
        self.averager = build_averager(spec, workers=[self.rank], seed=self.seed, shapes=[p.shape for _, p in named],
                                       keys=[name for name, _ in named], error_feedback=error_feedback,
                                       generator=lambda _: self.generator, payloads=False)
        if self.averager.remembers_means and non_finite != "raise":  # a NaN mean would stay in its memory
            raise ConfigError(f"non_finite={non_finite!r} does not combine with {spec}: its memory of past "
                              "means would keep the NaN; use non_finite='raise'")
        # DDP's find_unused_parameters (without static_graph): DDP leaves the gradient of a parameter
        # that no rank used this step as it was and never applies what the hook averaged for it, so
        # a residual from which the hook subtracted what it "sent" would lose that part for good
        dynamic_unused = (isinstance(model, DistributedDataParallel) and model.find_unused_parameters
                          and not model.static_graph)
        # an averager with its own collectives keeps its own error memory unless its spec turns it off
        keeps_errors = (error_feedback if self.averager.carries_payloads else
                        parse_spec(spec)[1].get("error_feedback", "false") == "true")
        if dynamic_unused and keeps_errors:
            raise ConfigError(
                f"error feedback ({spec}{' with error_feedback=True' if error_feedback else ''}) does not combine "
                "with DistributedDataParallel(find_unused_parameters=True): DDP does not apply the mean of a "
                "parameter that no rank used in a step, so the part of its residual sent then would be lost; "
                "use find_unused_parameters=False, static_graph=True, or no error feedback"
                + ("" if self.averager.carries_payloads else " (powersgd:error_feedback=false)"))
        if grad_scaler is not None and not self.averager.carries_payloads:
            raise ConfigError(f"grad_scaler= does not combine with {spec}: its error memory is kept in the loss "
                              "scale's units (grad_scaler= keeps the residuals of byte compressors); use "
                              "grad_scaler=None")
        if not grouped:
            raise RuntimeError("gradwire.ddp: call torch.distributed.init_process_group() first")
        # byte payloads: the compressor and this rank's residuals; else the averager's own collectives
        self.compressor = self.averager.compressor if self.averager.carries_payloads else None
        self.error_feedback = self.averager.ef[self.rank] if self.compressor and self.averager.ef else None
        self.path = _path(self.averager)
        # 1/world_size in float32: what the division multiplies a float32, bfloat16 or float16 bucket by,
        # as plain DDP does (_divide_checking; a float64 bucket by the double 1/world_size)
        self.reciprocal = torch.full((1,), 1.0 / self.world_size, device=self.device)
        self._thread = None
        # backward passes seen (never saved or restored, unlike step: a step retried after
        # load_state_dict is a new pass), and the last whose PowerSGD bucket failed
        self._passes, self._failed_pass = 0, -1
        # with a GradScaler, residuals are kept unscaled: the pass whose scale was read, and that scale
        self.grad_scaler = grad_scaler if self.error_feedback is not None else None
        self._scale, self._scale_pass = 1.0, -1
        # PowerSGD under DDP's find_unused_parameters: the last bucket's hook waits for the thread
        # (DDP then issues its allreduce of the used parameters, after the hook's on every rank)
        self._wait_last = dynamic_unused and not self.averager.carries_payloads
        # non_finite="propagate": residuals as they were before this pass encoded them, restored if
        # any bucket of the pass comes back non-finite (the step is skipped)
        self._before: dict[str, torch.Tensor | None] = {}
        self._before_pass, self._skipped_pass = -1, -1

    def communication_thread(self) -> ThreadPoolExecutor:
        """The one thread that runs PowerSGD's buckets (started at the first), in submission order."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gradwire-ddp-rank{self.rank}")
        return self._thread

    def state_dict(self) -> dict:
        residuals = self.error_feedback.state_dict() if self.error_feedback else {}
        state = {"compressor": self.averager.spec(), "error_feedback": self.error_feedback is not None,
                 "seed": self.seed, "rank": self.rank, "world_size": self.world_size, "step": self.step,
                 "bytes_sent": self.bytes_sent, "wire_bytes_sent": self.wire_bytes_sent,
                 "residuals": residuals, "min_compress_numel": self.min_compress_numel}
        if not self.averager.carries_payloads:  # its memory ("powersgd": Q and errors by parameter name)
            state.update(self.averager.state_dict())
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` saved by the same rank of a run with the same settings."""
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise ConfigError(f"gradwire.ddp state lacks {missing}: not a HookState.state_dict()")
        mine = self.state_dict()
        saved = dict(state, compressor=resolved_spec(state["compressor"]))
        keys = ("compressor", "error_feedback", "rank", "world_size", *(k for k in OPTIONAL_STATE_KEYS if k in state))
        for key in keys:
            if saved[key] != mine[key]:
                raise ConfigError(
                    f"gradwire.ddp state was saved with {key}={state[key]!r}, this hook has {mine[key]!r}; "
                    "residuals belong to one rank of one configuration (start without the state instead)")
        numels = {name: numel for _, name, numel in self._params.values()}
        bad = sorted(name for name, r in state["residuals"].items()
                     if name not in numels or not isinstance(r, torch.Tensor) or r.shape != (numels[name],))
        if bad:
            raise ConfigError(f"gradwire.ddp state has residuals for unknown parameters or of the wrong "
                              f"size: {bad[:5]}")
        if self.error_feedback:
            self.error_feedback.load_state_dict(state["residuals"])
        if not self.averager.carries_payloads:
            self.averager.load_state_dict(state)
        self.seed, self.step = int(state["seed"]), int(state["step"])
        self.bytes_sent, self.wire_bytes_sent = int(state["bytes_sent"]), int(state["wire_bytes_sent"])

    def __repr__(self) -> str:
        ef = "+EF" if self.error_feedback else ""
        return (f"<gradwire.ddp hook {self.averager.spec()}{ef} rank {self.rank}/{self.world_size}, "
                f"step {self.step}, {self.bytes_sent} bytes sent>")


def resolved_spec(spec: str) -> str:
    """``spec`` with every default filled in as this version renders it, so a hook state saved
    before a key gained a default (qsgd's ``format``, whose old payloads are ``format=1`` but whose
    residuals are the same numbers) loads; a spec this version cannot build is returned as it is."""
    try:
        return build_method(spec).spec()
    except ConfigError:
        return spec


def _check_settings(compressor, error_feedback, seed, timeout_s, min_compress_numel, non_finite,
                    grad_scaler) -> None:
    """Each setting's type and range, one ConfigError naming the argument, its value and what is valid
    (before anything is built; a bool is refused where a number is wanted: True is no seed)."""
    def integer(value) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    if not (isinstance(compressor, str) or callable(getattr(compressor, "spec", None))):
        raise ConfigError(f"compressor={compressor!r}: valid values are a spec string (see `gradwire list`, "
                          "e.g. 'qsgd:levels=4') or a gradwire Compressor")
    if not isinstance(error_feedback, bool):
        raise ConfigError(f"error_feedback={error_feedback!r}: valid values are True and False")
    if not integer(seed):
        raise ConfigError(f"seed={seed!r}: valid values are ints")
    if not (isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool) and timeout_s > 0
            and math.isfinite(timeout_s)):
        raise ConfigError(f"timeout_s={timeout_s!r}: valid values are positive finite numbers of seconds")
    if not (integer(min_compress_numel) and min_compress_numel >= 0):
        raise ConfigError(f"min_compress_numel={min_compress_numel!r}: valid values are ints >= 0")
    if not (isinstance(non_finite, str) and non_finite in NON_FINITE):
        raise ConfigError(f"non_finite={non_finite!r}: valid choices are {', '.join(NON_FINITE)}")
    if not (grad_scaler is None or isinstance(grad_scaler, torch.amp.GradScaler)):
        raise ConfigError(f"grad_scaler={grad_scaler!r}: valid values are a torch.amp.GradScaler and None")


def register(ddp_model: DistributedDataParallel, compressor: str | Compressor = "none", *,
             error_feedback: bool = False, seed: int = 0, process_group=None,
             timeout_s: float = 1800.0, min_compress_numel: int = 1024, non_finite: str = "raise",
             grad_scaler: torch.amp.GradScaler | None = None) -> HookState:
    """Install the gradwire hook on ``ddp_model`` (before its first backward) and return its state.

    ``process_group`` defaults to the model's own. Unknown compressor specs raise ConfigError
    listing the valid ones. See :class:`HookState` for every knob.
    """
    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError(f"gradwire.ddp.register wants a DistributedDataParallel, "
                        f"got {type(ddp_model).__name__}")
    sparse = [name for name, m in ddp_model.module.named_modules()
              if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse
              and m.weight.requires_grad]  # (a frozen one has no gradient to average)
    if sparse:
        raise ConfigError(f"gradwire.ddp: module {sparse[0]!r} has sparse gradients (sparse=True), which gradwire's "
                          "hook does not average (its compressors and error feedback work on dense buckets): give it "
                          "sparse=False, or leave this model on DDP's own allreduce")
    group = process_group if process_group is not None else ddp_model.process_group
    state = HookState(ddp_model, compressor, error_feedback=error_feedback, seed=seed,
                      process_group=group, timeout_s=timeout_s, min_compress_numel=min_compress_numel,
                      non_finite=non_finite, grad_scaler=grad_scaler)
    ddp_model.register_comm_hook(state, hook)
    return state


def hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: average ``bucket``'s gradients through ``state.averager``."""
    if bucket.buffer().is_sparse:  # a sparse gradient of a module register() did not recognise
        raise ConfigError(f"gradwire.ddp: bucket {bucket.index()} holds sparse gradients, which gradwire's hook does "
                          "not average: make the module's gradients dense, or leave this model on DDP's own "
                          "allreduce")
    future = state.path(state, bucket)
    if bucket.is_last():
        if state._wait_last:
            # DDP (find_unused_parameters) issues an allreduce of its own once this hook returns: wait
            # until the thread has run every bucket of the pass, so that on every rank it comes after
            # all of the hook's collectives (their errors reach DDP through the futures, not here)
            state.communication_thread().submit(lambda: None).result()
        state.step += 1
        state._passes += 1
    return future


def _path(averager):
    """Which way the hook takes every bucket, chosen once from what the averager declares: its own
    collectives (PowerSGD), one in-place allreduce (uncompressed, no error feedback), one allreduce
    of the encoded bucket (the summable casts), or an all-gather of byte payloads (the rest)."""
    if not averager.carries_payloads:
        return _averager_collectives
    if averager.plain():
        return _allreduce_in_place
    return _allreduce if averager.compressor.summable else _allgather


def _averager_collectives(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """An averager that runs its own collectives (PowerSGD: :meth:`PowerSGD.average`, one parameter,
    one key: the memory does not care how DDP buckets them) on the hook state's communication thread
    with ``dist.all_reduce`` as its ``allreduce_mean``: the hook
    returns at once, and DDP's backward pass goes on computing the next buckets' gradients while this
    one's two allreduces travel (PyTorch's hook chains its allreduces through future callbacks for the
    same reason). One thread takes the buckets in the order DDP hands them over, which is the same on
    every rank, so every rank issues its collectives in the same order. DDP waits for the returned
    future at the end of the backward pass, so nothing reads the memory or the counters meanwhile."""
    buffer, world, layout = bucket.buffer(), state.world_size, _layout(state, bucket)
    grads = [buffer[o:o + k].view(state._shapes[name]) for _, name, o, k in layout]
    indices = [i for i, *_ in layout]
    step, index, backward = state.step, bucket.index(), state._passes

    def allreduce_mean(tensors: dict[int, torch.Tensor]) -> torch.Tensor:
        total = tensors[state.rank]  # a new tensor (the concatenated factors): summed in place
        _wait(state, dist.all_reduce(total, group=state.process_group, async_op=True), bucket, "PowerSGD factors",
              "allreduce", step=step)
        nbytes = ledger.broadcast(total.numel() * total.element_size(), world)
        state.bytes_sent += nbytes
        state.wire_bytes_sent += nbytes
        return total.div_(world)

    def mean() -> torch.Tensor:
        state.averager.set_step(step)
        averaged = state.averager.mean_tensors_by(allreduce_mean, {state.rank: grads}, indices)
        out = torch.cat([t.reshape(-1) for t in averaged]) if averaged else buffer.clone()
        # A NaN or inf anywhere reaches every rank through the sums, so every rank stops here alike.
        if not bool(torch.isfinite(out).all()):
            raise DivergenceError(f"gradwire.ddp: step {step}, bucket {index}: non-finite gradients after "
                                  f"{state.averager.spec()} (a rank's gradient was not finite)", step=step)
        return out.to(buffer.dtype)

    done, outcome = torch.futures.Future(), {}

    def job() -> None:
        if state._failed_pass == backward:  # DDP raises the earlier bucket's error: no collective for this one
            outcome["error"] = CommunicationError(f"gradwire.ddp: step {step}, bucket {index}: not sent, an "
                                                  "earlier bucket of this step failed")
        else:
            try:
                outcome["mean"] = mean()
            except BaseException as error:  # noqa: BLE001 - handed to DDP, which raises it where it waits
                state._failed_pass = backward  # the later buckets would wait out a timeout each for nothing
                outcome["error"] = error
        done.set_result(None)

    def finish(_: torch.futures.Future) -> torch.Tensor:
        # raised in a callback, as on the other paths, DDP names the error's type ("... when running the
        # callback: DivergenceError: ..."); a bare Future's set_exception reached the user as "Unable to
        # cast <message> to Tensor"
        if "error" in outcome:
            raise outcome["error"]
        return outcome["mean"]

    state.communication_thread().submit(job)
    return done.then(finish)


def _layout(state: HookState, bucket: dist.GradBucket) -> list[tuple[int, str, int, int]]:
    """``(parameter index, name, offset, numel)`` of each parameter in the bucket's flat buffer
    (DDP lays their gradients out back to back in ``bucket.parameters()`` order)."""
    out, offset = [], 0
    for p in bucket.parameters():
        if id(p) not in state._params:
            raise RuntimeError("gradwire.ddp: a bucket holds a parameter that the model did not have "
                               "at register()")
        index, name, numel = state._params[id(p)]
        out.append((index, name, offset, numel))
        offset += p.numel()
    if offset != bucket.buffer().numel():
        raise RuntimeError(f"gradwire.ddp: bucket {bucket.index()} holds {bucket.buffer().numel()} elements, "
                           f"its parameters {offset}")
    return out


def _encode(state: HookState, grad: torch.Tensor, index: int, name: str) -> Packet:
    state.generator.manual_seed(hash_seed(state.seed, "compress", state.rank, state.step, index))
    ef = state.error_feedback
    if ef is None:
        return state.averager.encode(state.rank, grad, key=name)  # drawing from this rank's generator
    old = ef.residuals.get(name)  # never changed in place: encoding stores a new tensor
    if state.non_finite == "propagate":  # kept until the pass is over, in case the step is skipped
        if state._before_pass != state._passes:
            state._before, state._before_pass = {}, state._passes
        state._before.setdefault(name, old)
    scale = _loss_scale(state) if state.grad_scaler is not None else None
    if scale is not None and old is not None:
        ef.residuals[name] = old * scale  # kept unscaled: in this step's loss-scaled units
    try:
        packet = state.averager.encode(state.rank, grad, key=name)  # with this rank's residuals
    except ValueError:
        _put_back(ef, name, old)
        raise
    if scale is not None:
        ef.residuals[name].div_(scale)
    return packet


def _loss_scale(state: HookState) -> float:
    """The GradScaler's scale of this backward pass, read once per pass (``get_scale`` waits for the
    device): the loss was multiplied by it, and so is every gradient the hook sees."""
    if state._scale_pass != state._passes:
        state._scale, state._scale_pass = float(state.grad_scaler.get_scale()), state._passes
    return state._scale


def _put_back(ef, name: str, old: torch.Tensor | None) -> None:
    if old is None:
        ef.residuals.pop(name, None)
    else:
        ef.residuals[name] = old


def _skip(state: HookState, backward: int) -> None:
    """``non_finite="propagate"``: pass ``backward`` gave some bucket a non-finite mean, so the step is
    skipped (GradScaler): every residual that the pass changed goes back to what it was. Called by
    the failing bucket's completion and, should it come after, by every other bucket's (an encode
    may have been under way when the failing bucket put the residuals back)."""
    state._skipped_pass = backward
    _restore_if_skipped(state, backward)


def _restore_if_skipped(state: HookState, backward: int) -> None:
    if state.error_feedback is None or state._skipped_pass != backward or state._before_pass != backward:
        return
    for name, old in list(state._before.items()):
        _put_back(state.error_feedback, name, old)


def _stop(state: HookState, error: DivergenceError, buffer: torch.Tensor, backward: int) -> torch.Tensor:
    """A bucket that some rank could not encode: raise ``error`` (``non_finite="raise"``), or return
    NaN for the whole bucket on every rank (``"propagate"``), so that a mixed-precision
    ``GradScaler`` sees the overflow and skips the step, as it would without the hook; the residuals
    of pass ``backward`` are put back as they were (:func:`_skip`)."""
    if state.non_finite == "raise":
        raise error
    _skip(state, backward)
    return torch.full_like(buffer, math.nan)


def _refused(state: HookState, bucket: dist.GradBucket, layout, error: ValueError) -> DivergenceError:
    """The error for a gradient the compressor refused, naming the bucket and the parameter."""
    flat = bucket.buffer()
    where = ""
    bad = (~torch.isfinite(flat)).nonzero()
    if bad.numel():
        at = int(bad[0])
        name, offset = next((n, o) for _, n, o, k in layout if o <= at < o + k)
        where = (f"a non-finite gradient ({float(flat[at])}) in parameter {name!r} at its flat index "
                 f"{at - offset} (bucket element {at}); ")
    return DivergenceError(
        f"gradwire.ddp: step {state.step}, rank {state.rank}, bucket {bucket.index()}: {where}"
        f"{state.compressor.spec()} refused it: {error}", step=state.step, worker=state.rank)


def _allreduce_in_place(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """``none`` without error feedback in one pass, as PyTorch's own ``allreduce_hook``: divide the
    bucket in place, allreduce it in place, and hand DDP back the bucket's own storage. The only
    additions: the byte count (arithmetic, no read), and the finiteness check, made by the division
    itself (:func:`_divide_checking`) on this rank's share, not by a second read of the bucket.

    Every rank stops alike on a non-finite gradient without reading the averaged bucket: the rank
    that has one fills its whole share with NaN before the allreduce, so that every element of
    every rank's sum is NaN, and each rank looks at the first element only. (A sum of finite shares
    is finite, each being at most the float32 limit over the world size, but for gradients within
    a rounding of that limit, whose sum could still overflow unseen.)"""
    buffer = bucket.buffer()
    finite = _divide_checking(state, buffer)
    sent = ledger.broadcast(buffer.numel() * buffer.element_size(), state.world_size)
    state.bytes_sent += sent
    state.wire_bytes_sent += sent
    step = state.step  # the last bucket's hook moves it on before this callback runs
    mine = None if finite else _poison(state, bucket, buffer, step)

    def finish(done: torch.futures.Future) -> torch.Tensor:
        done.value()  # re-raises a failed collective
        if mine is None and not (buffer.numel() and math.isnan(float(buffer[0]))):
            return buffer
        if state.non_finite == "propagate":  # NaN for the whole bucket on every rank, as _stop gives
            return buffer
        raise mine or DivergenceError(
            f"gradwire.ddp: step {step}, rank {state.rank}, bucket {bucket.index()}: a peer's gradient was not "
            f"finite (see its error); every rank stops", step=step, worker=state.rank)

    return dist.all_reduce(buffer, group=state.process_group, async_op=True).get_future().then(finish)


def _divide_checking(state: HookState, buffer: torch.Tensor) -> bool:
    """Divide ``buffer`` by the world size in place, as plain DDP does; whether every element is
    finite. One pass: the unscaling op of mixed precision's GradScaler
    (``torch._amp_foreach_non_finite_check_and_unscale_``) multiplies by 1/world_size in float32 and
    flags a non-finite element on the way, for the CPU time of ``div_`` alone (0.16 ms for 1M
    float32 from memory, against 0.28 ms for ``div_`` and a sum; thread CPU time, one thread, this
    machine). Multiplying by float32(1/world_size) is what plain DDP does to a gradient as it copies
    it into its bucket (without a hook), so the mean is plain DDP's bit for bit at every world size
    (tested at 2 and, fp32, bf16 and fp64, at 3: tests/ddp/test_hook_averager.py); PyTorch's
    ``allreduce_hook`` divides instead, which differs from it in the last bit where 1/world_size is
    inexact (3, 5, 6...). A float64 bucket is multiplied by the double 1/world_size, as plain DDP does
    (the fused op's float32 factor would differ), and checked by a second read."""
    if buffer.dtype == torch.float64:  # plain DDP multiplies by the double 1/world_size (a float32 one differs)
        buffer.mul_(1.0 / state.world_size)
        return bool(torch.isfinite(buffer).all())
    if not _fused_unscale_supports(buffer):  # bf16 on CUDA: multiply as the fused op does, then check
        buffer.mul_(state.reciprocal)  # a float32 factor: the product in float32, rounded to the buffer's dtype
        return bool(torch.isfinite(buffer).all())
    found = torch.zeros(1, device=buffer.device)
    torch._amp_foreach_non_finite_check_and_unscale_([buffer], found, state.reciprocal)
    return not found.item()


def _fused_unscale_supports(buffer: torch.Tensor) -> bool:
    """Whether ``torch._amp_foreach_non_finite_check_and_unscale_`` takes ``buffer``: on CUDA only
    float16, float32 and float64 (bfloat16 is not implemented there: pytorch/pytorch#127176); on the
    CPU every floating dtype."""
    return buffer.device.type != "cuda" or buffer.dtype in (torch.float16, torch.float32, torch.float64)


def _poison(state: HookState, bucket: dist.GradBucket, buffer: torch.Tensor, step: int) -> DivergenceError:
    """This rank's share is not finite: the error naming the parameter and element (raised when the
    allreduce completes, so that the peers are not left waiting for this rank's later buckets), and
    the share filled with NaN, which the allreduce takes to every element of every rank's sum."""
    at = int((~torch.isfinite(buffer)).nonzero()[0])
    name, offset = next((n, o) for _, n, o, k in _layout(state, bucket) if o <= at < o + k)
    error = DivergenceError(
        f"gradwire.ddp: step {step}, rank {state.rank}, bucket {bucket.index()}: a non-finite gradient "
        f"({float(buffer[at])}) in parameter {name!r} at its flat index {at - offset} (bucket element {at}), "
        f"with {state.averager.spec()}; every rank stops", step=step, worker=state.rank)
    buffer.fill_(math.nan)
    return error


def _allreduce(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer, layout = bucket.buffer(), _layout(state, bucket)
    # Divide before summing, as DDP does: a 16-bit sum overflows only where the mean would (the
    # reason PyTorch's fp16_compress_hook gives for the same order). By div_, as that hook does
    # (plain DDP multiplies by 1/world_size: the same bits where that is a power of two).
    share = buffer.div_(state.world_size)
    wire_dtype = state.compressor.wire_dtype(buffer.dtype)
    refused = None
    try:
        if state.error_feedback:  # residuals per parameter, so encode parameter by parameter
            packets = [_encode(state, share[o:o + k], i, n) for i, n, o, k in layout]
            payload = torch.cat([p.buffer for p in packets])
        else:
            payload = state.compressor.encode(share).buffer
        values = payload.view(wire_dtype)
    except ValueError as error:
        refused = _refused(state, bucket, layout, error)
        # NaN everywhere: the sum tells every peer, who then stops too instead of waiting for us
        values = torch.full((buffer.numel(),), math.nan, dtype=wire_dtype, device=buffer.device)
    nbytes = ledger.broadcast(values.numel() * values.element_size(), state.world_size)
    state.bytes_sent += nbytes
    state.wire_bytes_sent += nbytes
    step, index, backward = state.step, bucket.index(), state._passes
    future = dist.all_reduce(values, group=state.process_group, async_op=True).get_future()

    # A refusal surfaces when DDP waits for the future, not here: raising now would leave the peers
    # waiting for this rank's allreduces of the later buckets (their hooks would still launch them).
    def finish(done: torch.futures.Future) -> torch.Tensor:
        total = done.value()[0]
        if state.non_finite == "propagate":  # any rank's NaN is in the sum already
            if state.error_feedback is not None and not bool(torch.isfinite(total).all()):
                _skip(state, backward)  # GradScaler skips the step: the residuals go back
            else:
                _restore_if_skipped(state, backward)
            return state.compressor.decode(Packet(total.view(torch.uint8), buffer.shape, buffer.dtype))
        if refused is not None:
            raise refused
        if total.numel() and bool(torch.isnan(total[0])):
            raise DivergenceError(f"gradwire.ddp: step {step}, bucket {index}: a peer's gradient was "
                                  "refused (see its error); every rank stops", step=step)
        # every share was finite, but their sum can leave the wire dtype's range (fp16: 65504)
        if not bool(torch.isfinite(total).all()):
            at = int((~torch.isfinite(total)).nonzero()[0])
            raise DivergenceError(
                f"gradwire.ddp: step {step}, rank {state.rank}, bucket {index}: the mean is not finite "
                f"({float(total[at])} at bucket element {at}): the sum of finite shares left the range of "
                f"{wire_dtype} that {state.compressor.spec()} sends; every rank stops", step=step, worker=state.rank)
        return state.compressor.decode(Packet(total.view(torch.uint8), buffer.shape, buffer.dtype))

    return future.then(finish)


def _wait(state: HookState, work, bucket: dist.GradBucket, what: str, collective: str = "all-gather",
          step: int | None = None) -> None:
    """Wait for a collective the hook waits for itself (the sizes-first path's, PowerSGD's on its
    thread): at most ``timeout_s``, or the process group's own timeout where that is shorter, the
    limit the error names (it said ``timeout_s`` whichever had fired)."""
    try:
        work.wait(timeout=timedelta(seconds=state.timeout_s))
    except RuntimeError as error:
        step = state.step if step is None else step
        raise CommunicationError(f"gradwire.ddp: step {step}, rank {state.rank}, bucket "
                                 f"{bucket.index()}: {collective} of {what} failed or took longer than "
                                 f"{_limit(state)}: {error}") from error


def _limit(state: HookState) -> str:
    """The wait that bounds the hook's own waits: ``timeout_s``, or the process group's timeout
    where that is shorter (gloo's collectives give up after it whatever the wait allows)."""
    group = _group_timeout_s(state)
    if group is not None and group < state.timeout_s:
        return f"the process group's timeout, {group:g} s (timeout_s={state.timeout_s:g} s is longer)"
    return f"timeout_s={state.timeout_s:g} s"


def _group_timeout_s(state: HookState) -> float | None:
    """The process group's own timeout in seconds (``init_process_group(timeout=...)``, ``new_group``);
    None where its backend does not say (torch keeps it in the backend's options, not a public API)."""
    try:
        group = state.process_group if state.process_group is not None else dist.group.WORLD
        return group._get_backend(state.device).options._timeout.total_seconds()
    except Exception:  # noqa: BLE001 - torch's private attributes: then the message names timeout_s alone
        return None


def _allgather(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Encode the bucket parameter by parameter, all-gather the payloads, decode the mean."""
    buffer, layout = bucket.buffer(), _layout(state, bucket)
    # Parameters below min_compress_numel travel raw, all of a bucket's in one `none` packet at the
    # front of the payload: lossless, so how DDP groups them changes nothing, and one call instead
    # of a codec's fixed cost (a few tenths of a ms per encode) for every bias.
    raw = [k < state.min_compress_numel for *_, k in layout]
    small = [(o, k) for (_, _, o, k), r in zip(layout, raw, strict=True) if r]
    # one size per parameter (raw ones: their own bytes), so that totals do not depend on the layout;
    # a bounded codec (top-k) travels framed at its bound (wire.frame), so its sizes are known too
    framed = _framed(state.compressor, buffer.dtype)
    fixed = [k * buffer.element_size() if r else
             state.compressor.max_nbytes(k, buffer.dtype) + FRAME_BYTES if framed else
             state.compressor.nbytes(k, buffer.dtype)
             for (*_, k), r in zip(layout, raw, strict=True)]
    refused, packets = None, []
    try:
        packets = [_RAW.encode(torch.cat([buffer[o:o + k] for o, k in small]))] if small else []
        packets += [_encode(state, buffer[o:o + k], i, n) for (i, n, o, k), r in zip(layout, raw, strict=True)
                    if not r]
    except ValueError as error:
        refused = _refused(state, bucket, layout, error)
    if None not in fixed:
        return _gather_fixed(state, bucket, layout, raw, small, fixed, packets, refused, framed)
    return _gather_variable(state, bucket, layout, raw, small, packets, refused)


def _framed(compressor: Compressor, dtype: torch.dtype) -> bool:
    """Whether the codec's payloads vary in size within a bound (top-k: a fixed count of positions),
    so that they travel framed at it; a fixed-size codec needs no frame, an unbounded one
    (threshold) exchanges sizes first."""
    return compressor.nbytes(1, dtype) is None and compressor.max_nbytes(1, dtype) is not None


def _gather_fixed(state: HookState, bucket, layout, raw, small, sizes, packets, refused, framed):
    """Every size is known to every rank (fixed-size codecs, and bounded ones framed at their bound):
    one asynchronous all-gather of ``[status byte][payloads]`` and the decoding when it completes,
    with no size exchange and no wait inside the hook. The status byte is 1 where a rank could not
    encode its gradient: every rank then stops after the collective instead of leaving its peers
    waiting."""
    buffer, world = bucket.buffer(), state.world_size
    total = 1 + sum(sizes)
    send = torch.zeros(total, dtype=torch.uint8, device=buffer.device)  # status 0: encoded
    if refused is None:
        compressed = iter(s for s, r in zip(sizes, raw, strict=True) if not r)
        try:  # a payload over its bound (a codec's error) stops every rank, as a refused encode does
            buffers = [p.buffer for p in packets[:bool(small)]]
            buffers += [frame(p.buffer, next(compressed) - FRAME_BYTES) if framed else p.buffer
                        for p in packets[bool(small):]]
            torch.cat(buffers, out=send[1:])
        except ValueError as error:
            refused = _refused(state, bucket, layout, error)
    if refused is not None:
        send[0] = 1
    received = torch.empty(world * total, dtype=torch.uint8, device=buffer.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the name before 2.13
    future = gather(received, send, group=state.process_group, async_op=True).get_future()
    payload = sum(p.nbytes for p in packets) if refused is None and framed else sum(sizes)
    state.bytes_sent += ledger.broadcast(payload, world)
    state.wire_bytes_sent += ledger.broadcast(total, world)
    step, index, backward = state.step, bucket.index(), state._passes

    def finish(done: torch.futures.Future) -> torch.Tensor:
        done.value()  # re-raises a failed collective
        rows = received.view(world, total)
        if refused is not None:
            return _stop(state, refused, buffer, backward)
        failed = rows[:, 0].nonzero().view(-1).tolist()
        if failed:
            return _stop(state, DivergenceError(
                f"gradwire.ddp: step {step}, bucket {index}: rank(s) {failed} could not encode their gradient "
                "(see their error); every rank stops", step=step, worker=failed[0]), buffer, backward)
        _restore_if_skipped(state, backward)
        return _decode_mean(state, buffer, layout, raw, small, [(rows[r, 1:], sizes) for r in range(world)],
                            framed)

    return future.then(finish)


def _gather_variable(state: HookState, bucket, layout, raw, small, packets, refused):
    """Data-dependent sizes (threshold, top-k): the sizes first, then the payloads padded to the
    longest (gloo's all_gather wants equal sizes), both waited for here."""
    buffer, world, group = bucket.buffer(), state.world_size, state.process_group
    if refused is None:
        compressed = iter(p.nbytes for p in packets[bool(small):])
        sizes = torch.tensor([k * buffer.element_size() if r else next(compressed)
                              for (*_, k), r in zip(layout, raw, strict=True)], dtype=torch.int64,
                             device=buffer.device)
    else:
        sizes = torch.full((len(layout),), -1, dtype=torch.int64, device=buffer.device)  # the peers stop too
    all_sizes = [torch.empty_like(sizes) for _ in range(world)]
    _wait(state, dist.all_gather(all_sizes, sizes, group=group, async_op=True), bucket, "payload sizes")
    state.wire_bytes_sent += ledger.broadcast(sizes.numel() * ledger.SIZE_BYTES, world)  # sent, whatever follows
    failed = [r for r, s in enumerate(all_sizes) if bool((s < 0).any())]
    if refused is not None or failed:
        error = refused or DivergenceError(
            f"gradwire.ddp: step {state.step}, bucket {bucket.index()}: rank(s) {failed} could not encode "
            "their gradient (see their error); every rank stops", step=state.step, worker=failed[0])
        future = torch.futures.Future()
        future.set_result(_stop(state, error, buffer, state._passes))
        return future
    totals = [int(s.sum()) for s in all_sizes]
    send = torch.zeros(max(totals), dtype=torch.uint8, device=buffer.device)
    torch.cat([p.buffer for p in packets], out=send[:totals[state.rank]])
    received = [torch.empty_like(send) for _ in range(world)]
    _wait(state, dist.all_gather(received, send, group=group, async_op=True), bucket, "payloads")
    state.bytes_sent += ledger.broadcast(totals[state.rank], world)
    state.wire_bytes_sent += ledger.broadcast(send.numel(), world)  # padded to the longest rank's
    _restore_if_skipped(state, state._passes)
    mean = _decode_mean(state, buffer, layout, raw, small,
                        [(received[r], all_sizes[r].tolist()) for r in range(world)])
    future = torch.futures.Future()
    future.set_result(mean)
    return future


def _decode_mean(state: HookState, buffer: torch.Tensor, layout, raw, small, payloads,
                 framed: bool = False) -> torch.Tensor:
    """The mean of every rank's payload ``(bytes, size per parameter)``, decoded and summed in rank
    order, so that every rank adds the same numbers in the same order. (A 16-bit bucket's mean
    cannot leave its range: every decoded value is within it, the codecs refuse any other.)"""
    mean = torch.zeros(buffer.numel(), dtype=work_dtype(buffer.dtype), device=buffer.device)
    for payload, rank_sizes in payloads:
        start = sum(size for size, r in zip(rank_sizes, raw, strict=True) if r)
        if small:
            numels = [k for _, k in small]
            values = _RAW.decode(Packet(payload[:start], torch.Size([sum(numels)]), buffer.dtype))
            for (o, k), piece in zip(small, values.split(numels), strict=True):
                mean[o:o + k] += piece
        for (_, _, o, k), size, r in zip(layout, rank_sizes, raw, strict=True):
            if not r:
                piece = payload[start:start + size]
                if framed:
                    piece = unframe(piece, state.compressor.name)
                mean[o:o + k] += state.compressor.decode(Packet(piece, torch.Size([k]), buffer.dtype))
                start += size
    return mean.div_(len(payloads)).to(buffer.dtype)
