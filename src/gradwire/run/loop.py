"""The run loop: build everything from a RunConfig, train, evaluate, write the run folder.

Run folder: ``config.json`` (fully resolved, written first), ``steps.jsonl`` (every step's loss and
algorithm figures), ``metrics.jsonl`` (one object per evaluation, flushed as it is written, so a
crash loses nothing already measured), ``summary.json`` (written last, also after a divergence),
``curves.png`` and, with ``checkpoint_every``, ``checkpoint/``. On the torch backend every rank
trains and rank 0 alone evaluates and writes.

The writing process claims the folder first (``report/run_folder.claim``: an OS lock for the run's
duration; a folder holding a run only with ``overwrite`` or ``resume``). SIGTERM and SIGINT end a
run as "stopped" with its summary written; on the simulator the loop stops between steps and, with
``checkpoint_every``, saves the step reached, so ``--resume`` continues it. Away from a terminal a
progress line goes to stderr every ``GRADWIRE_PROGRESS_S`` seconds (default 10).

``Run`` builds the pieces; its driver (``servers/driver.py``, chosen by ``run/drivers.py``) steps
them, and the loop (``_train``) asks it nothing about what it is. The loop's other parts live
beside it: ``checkpointer.py`` (every stateful piece saved and loaded), ``evaluate.py`` (the
metrics rows), ``folder.py`` (config.json's extra entries, the summary).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from gradwire import checkpoint, kernels
from gradwire.algorithms import ALGORITHMS, CodecConfig, Context, OptimConfig
from gradwire.config import RunConfig, naming_flag
from gradwire.errors import (
    AlreadyFinished,
    CommunicationError,
    ConfigError,
    DivergenceError,
    NoCheckpointToContinue,
    Stopped,
)
from gradwire.fault.kill import fault_point_from_env
from gradwire.report.progress import ProgressLines, progress_mode
from gradwire.report.run_folder import claim, holds_run, read_json_or_empty
from gradwire.report.timeline import FOLDER as TIMELINE_FOLDER
from gradwire.report.timeline import Timeline
from gradwire.run.checkpointer import Checkpointer, RunCounters
from gradwire.run.combination import check_combination, resolved
from gradwire.run.drivers import build_driver
from gradwire.run.evaluate import Evaluator, evaluate_model
from gradwire.run.folder import open_run_folder, summary
from gradwire.run.stops import StopSignals, resume_step, stop_record
from gradwire.seeding import hash_seed
from gradwire.servers.driver import DriverParts, no_faults
from gradwire.tasks import build_partition, build_task
from gradwire.tasks.oracle import FlatModel, GradientOracle, WorkerData, check_batch_size
from gradwire.transports.base import Transport
from gradwire.transports.clocks import SimClock, WallClock
from gradwire.transports.network import NETWORKS
from gradwire.transports.sim import SimTransport
from gradwire.transports.stragglers import STRAGGLERS

# ``steps`` for Algorithm.evaluates_at that no step reaches: its regular evaluation steps alone
NO_LAST_STEP = 0
# seconds: the threads backend's main thread waits for its processes in slices this long, so that a
# signal's handler runs between them whichever thread the signal reached
JOIN_SLICE_S = 0.2


def _refuse_one_process_backend_under_torchrun(cfg: RunConfig) -> None:
    """``--backend sim`` (or threads) is the whole cluster in one process: under torchrun with
    several processes each would believe it is the one writer."""
    world = os.environ.get("WORLD_SIZE", "1")
    if cfg.backend != "torch" and world.isdigit() and int(world) > 1:
        raise ConfigError(f"--backend {cfg.backend} runs the whole cluster in one process, but torchrun started "
                          f"{world} (WORLD_SIZE={world}); use --backend torch (gradwire launch adds it when "
                          "--backend is not given)")


def _transport(cfg: RunConfig, server: bool, given: Transport | None, workers=None):
    """The simulator's transport, or this process's of a real backend (``given`` by the threads
    backend, else torch.distributed's; ``workers``: the data-parallel group of a tensor-parallel run)."""
    if cfg.backend == "sim":
        clock = SimClock()
        return SimTransport(cfg.workers, NETWORKS.build(cfg.network), clock), clock
    if given is not None:
        transport = given
    else:
        from gradwire.transports.torch_dist import TorchTransport, local_device

        if cfg.fault_tolerance != "none":  # one replica of a torchft job (transports/ft.py)
            from gradwire.transports.ft import FtTransport
            from gradwire.transports.ft_spec import parse

            return FtTransport(parse(cfg.fault_tolerance), cfg.workers), WallClock()
        transport = TorchTransport(timeout_s=cfg.timeout_s, device=local_device(cfg.device), workers=workers)
    expected = cfg.processes(server)
    if workers is None and transport.world_size != expected:  # tensor parallelism: TensorParallelRun checked it
        extra = " plus one server process" if server else ""
        fits = cfg.workers_for(transport.world_size, server)[0]
        raise ConfigError(f"--workers {cfg.workers}{extra} needs {expected} processes but {transport.world_size} "
                          f"were started; start {expected} (gradwire launch --nproc-per-node {expected}) or pass "
                          f"--workers {fits} (gradwire launch counts it when "
                          "--workers is left out)")
    if server:
        transport.serve_from_process_zero()
    return transport, WallClock()


class Run:
    """Everything one run needs, built from its config (also used by tests and benchmarks)."""

    def __init__(self, cfg: RunConfig, transport: Transport | None = None):
        self.started = time.perf_counter()
        self.wall_before = 0.0  # wall seconds of the attempts before, up to the checkpoint resumed from
        self.resumed_from: int | None = None  # the checkpoint's step, once resumed
        self.eval_s = 0.0       # wall seconds spent in evaluations (theirs included)
        self.cfg = cfg = check_combination(cfg).cfg  # the algorithm's --lr and --momentum where not given
        torch.set_num_threads(cfg.threads)
        dtype = {"float32": torch.float32, "float64": torch.float64}[cfg.dtype]
        self.task = build_task(cfg.task, num_workers=cfg.workers, seed=cfg.seed, dtype=dtype, data_dir=cfg.data_dir)
        shards = self.task.worker_indices
        if shards is None:
            with naming_flag("partition"):  # (a shard left empty by the task's data: found only here)
                shards = build_partition(cfg.partition, labels=self.task.partition_labels(), num_workers=cfg.workers,
                                         seed=cfg.seed)
        elif cfg.partition != "iid":
            raise ConfigError(f"task {cfg.task!r} fixes each worker's data itself; --partition {cfg.partition!r} "
                              "does not apply (leave it at iid) (--partition)")
        if len(shards) != cfg.workers:
            raise ConfigError(f"task {cfg.task!r} made data for {len(shards)} workers, not {cfg.workers}")
        self.algorithm = ALGORITHMS.build(cfg.algorithm)
        # a real backend gives the server of a server-mode algorithm a process of its own
        server_process = cfg.backend != "sim" and self.algorithm.needs_server
        self.tensor_parallel = None  # --tensor-parallel: the model split inside groups, the workers across them
        if cfg.tensor_parallel:
            from gradwire.parallel.hybrid import TensorParallelRun

            self.tensor_parallel = TensorParallelRun(cfg)
        self.transport, self.clock = _transport(cfg, server_process, transport,
                                                self.tensor_parallel and self.tensor_parallel.workers)
        # where the workers compute: the torch transport's GPU for this local rank, or --device
        self.device = self.transport.device or torch.device(cfg.device)
        kernels.use(cfg.kernels)  # the codecs' kernels, process-wide: torch (reference) or triton
        if self.device.type != "cpu":
            self.task = self.task.to(self.device)
        # under --fault-tolerance every replica writes its own run folder (it may outlive the others)
        self.is_writer = self.process_rank == 0 or cfg.fault_tolerance != "none"
        batch = None if cfg.batch_size == "full" else int(cfg.batch_size)
        self.shard_sizes = [len(s) for s in shards]
        check_batch_size(None if cfg.batch_size == "full" else int(cfg.batch_size), self.shard_sizes)
        workers = {r: WorkerData(self.task.x_train[shards[r]], self.task.y_train[shards[r]], batch_size=batch,
                                 seed=cfg.seed, rank=r) for r in self.transport.local_ranks}
        # drawn on the CPU, then moved: the same initial model on every device
        module = self.task.model_fn(torch.Generator().manual_seed(hash_seed(cfg.seed, "model")))
        if self.tensor_parallel:  # this process's shard of that same dense model
            module = self.tensor_parallel.shard(module, self.device)
        self.model = FlatModel(module.to(self.device))
        loss_fn = self.tensor_parallel.loss_fn if self.tensor_parallel else self.task.loss_fn
        self.oracle = GradientOracle(self.model, loss_fn, workers, l2=self.task.l2)
        self.ctx = Context(world_size=cfg.workers, local_ranks=self.transport.local_ranks, transport=self.transport,
                           oracle=self.oracle, stragglers=STRAGGLERS.build(cfg.stragglers, seed=cfg.seed),
                           clock=self.clock, seed=self._algorithm_seed(), shard_sizes=tuple(self.shard_sizes),
                           device=self.device,
                           shared_data=cfg.partition == "shared" and self.task.worker_indices is None,
                           inject_delays=cfg.backend != "sim" and not cfg.stragglers.startswith("none"),
                           param_shapes=tuple(self.model.shapes), param_roles=self.model.roles,
                           outer_state=cfg.outer_state,
                           backward_collectives=bool(self.tensor_parallel))
        optim = OptimConfig(lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay,
                            l1=self.task.l1, optimizer=cfg.optimizer, lr_schedule=cfg.lr_schedule, horizon=cfg.steps,
                            shapes=tuple(self.model.shapes), roles=self.model.roles)
        self.optim_config = optim
        self.codec_config = CodecConfig(compressor=cfg.compressor, error_feedback=cfg.error_feedback,
                                        compressed_mean=cfg.compressed_mean,
                                        owner_compressor=cfg.owner_compressor)
        try:
            self.algorithm.setup(self.ctx, self.model.flatten(), optim, self.codec_config)
        except ValueError as e:
            flag = "" if re.search(r"\(--[\w-]+\)$", str(e)) else " (--algorithm)"  # its flag, once
            raise ConfigError(f"algorithm {cfg.algorithm!r}: {e}{flag}") from None
        self._build_driver()

    def _algorithm_seed(self) -> int:
        """The seed of the algorithm's random streams (``Context.generator``): the run's, and under
        tensor parallelism one per tensor-parallel rank, so that the shards of one worker are not rounded
        with the same draws (equal across the data-parallel group, as PowerSGD's shared draws need)."""
        if not self.tensor_parallel:
            return self.cfg.seed
        return hash_seed(self.cfg.seed, "tensor-parallel", self.tensor_parallel.mesh.tp_rank)

    def _build_driver(self) -> None:
        """The checkpointer of every stateful piece, and the driver that steps them."""
        cfg = self.cfg
        self.counters = RunCounters()  # step, gradients, the losses since the last evaluation
        self.checkpointer = Checkpointer(Path(cfg.out) / "checkpoint", self.label, cfg.to_dict(),
                                         counters=self.counters, algorithm=self.algorithm, oracle=self.oracle,
                                         clock=self.clock, ctx=self.ctx, transport=self.transport, device=self.device,
                                         is_writer=self.is_writer, elapsed=self.elapsed)
        # a test's fault injection (GRADWIRE_KILL_AT, fault/kill.py); nothing otherwise
        self.fault_point = fault_point_from_env(os.environ, cfg.backend, self.transport.local_ranks) or no_faults
        parts = DriverParts(ctx=self.ctx, algorithm=self.algorithm, transport=self.transport, clock=self.clock,
                            timeout_s=cfg.timeout_s, checkpoints=self.checkpointer, fault_point=self.fault_point)
        self.driver = build_driver(cfg, parts, process_zero=self.process_rank == 0, replica=self._replica)
        self.checkpointer.driver = self.driver

    def _replica(self, parts: DriverParts):
        """The torchft replica driver of ``--fault-tolerance`` (fault/replica.py)."""
        from gradwire.fault.replica import ReplicaDriver

        full = self.cfg.batch_size == "full"  # a worker's samples per step: its batch, or its whole shard
        samples = [size if full else int(self.cfg.batch_size) for size in self.shard_sizes]
        return ReplicaDriver(parts.ctx, parts.algorithm, parts.transport, state=self.checkpointer,
                             counters=self.counters, setup=self._setup_at, samples=samples)

    def _setup_at(self, params: torch.Tensor) -> None:
        """The algorithm set up afresh at ``params`` (a replica healed from a peer's parameters)."""
        self.algorithm.setup(self.ctx, params, self.optim_config, self.codec_config)

    # the run's counters, kept by the checkpointer's RunCounters
    step = property(lambda self: self.counters.step, lambda self, v: setattr(self.counters, "step", v))
    gradients = property(lambda self: self.counters.gradients,
                         lambda self, v: setattr(self.counters, "gradients", v))
    window = property(lambda self: self.counters.window, lambda self, v: setattr(self.counters, "window", v))

    @property
    def process_rank(self) -> int:
        """This process's rank among all processes (a worker's rank but with --tensor-parallel)."""
        if self.tensor_parallel:
            return self.tensor_parallel.mesh.rank
        return self.transport.rank

    def wall_time(self) -> float:
        """The run's wall seconds: this attempt's so far plus the earlier attempts' up to the
        checkpoint it resumed from (the seconds between that checkpoint and a crash were redone)."""
        return self.wall_before + time.perf_counter() - self.started

    def elapsed(self) -> dict:
        """What a checkpoint keeps beside the state so that the wall time continues after a resume."""
        return {"wall_time_s": self.wall_time(), "eval_time_s": self.eval_s}

    @property
    def label(self) -> str:
        return "sim" if self.cfg.backend == "sim" else f"rank{self.process_rank}"

    def train_step(self) -> dict:
        self.step += 1
        self.oracle.step = self.ctx.timeline.step = self.step
        before = self.transport.bytes_sent
        info = self.driver.step(self.step)  # (under --fault-tolerance it may move self.step: a healed replica)
        if self.tensor_parallel:
            info = info | self.tensor_parallel.step_bytes(self.transport, before)
        self.gradients += int(info.get("gradients", 0))
        self.window.append(info["loss"])
        return info

    def evaluate(self) -> dict:
        return evaluate_model(self)

    def record_timeline(self, out: Path, resumed: bool) -> Timeline:
        """Every process records its workers' intervals into ``out/timeline/<label>.bin``
        (report/timeline.py); a resumed run keeps the records its checkpoint had."""
        timeline = Timeline(out / TIMELINE_FOLDER, self.label, clock=self.clock, simulated=self.cfg.backend == "sim")
        if resumed:
            timeline.resume_from(self.step)
        self.ctx.timeline = self.transport.timeline = timeline
        return timeline

    # -- checkpoints (run/checkpointer.py) ----------------------------------------------------------
    def state_dict(self) -> dict:
        return self.checkpointer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.checkpointer.load_state_dict(state)

    def save_checkpoint(self) -> None:
        self.driver.save_checkpoint(self.step)

    def resume(self) -> bool:
        """Continue from the latest checkpoint; False when there is none (for this process)."""
        elapsed = self.checkpointer.resume()
        if elapsed is None:
            return False
        self.wall_before = float(elapsed.get("wall_time_s", 0.0))
        self.eval_s = float(elapsed.get("eval_time_s", 0.0))
        self.resumed_from = self.step
        if self.is_writer:
            print(f"gradwire: resuming {self.cfg.out} from its checkpoint at step {self.step}",
                  file=sys.stderr, flush=True)
        return True


def run_threads(cfg: RunConfig, *, progress: bool | None = None, signals: StopSignals | None = None) -> dict:
    """``--backend threads``: every process of a real run as a thread (``transports/threads.py``);
    returns process 0's summary, or raises the first process's error. ``signals``: SIGTERM and
    SIGINT, heard by the main thread, which waits here; each process's loop stops at its next step
    (a process that waits on one already stopped stops too: the hub fails that wait at once)."""
    from gradwire.transports.threads import Hub, ThreadTransport

    world = check_combination(cfg).processes
    hub, results, errors = Hub(cfg.timeout_s), {}, {}
    cfg = resolved(cfg)

    def process(rank: int) -> None:
        try:
            results[rank] = _run(cfg, progress if rank == 0 else False, ThreadTransport(hub, world, rank), signals)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors[rank] = e
            hub.died(rank, f"{type(e).__name__}: {e}".splitlines()[0][:120])

    threads = [threading.Thread(target=process, args=(k,), name=f"gradwire-process-{k}") for k in range(world)]
    for t in threads:
        t.start()
    for t in threads:  # every wait inside is bounded by the timeout
        while t.is_alive():
            try:
                t.join(timeout=JOIN_SLICE_S)  # in slices: the main thread runs the signal handlers
            except Stopped:  # a second signal: the processes are stopping already; their summary comes
                continue
    if errors:
        raise threads_error(cfg, errors)
    return results[0]


def threads_error(cfg: RunConfig, errors: dict[int, BaseException]) -> BaseException:
    """What ``run_threads`` raises once every process thread has ended: the lowest process's error
    (process 0's, the writer's, where it has one). A stop's ``checkpoint_step`` is read again now:
    a process that stopped while the writer was still moving ``latest`` to the step they had all
    saved (the writer alone moves it) read the step before."""
    error = errors[min(errors)]
    if isinstance(error, Stopped):
        error.checkpoint_step = resume_step(cfg)
    return error


def run(cfg: RunConfig, *, progress: bool | None = None, transport: Transport | None = None) -> dict:
    """Train as configured and write the run folder; returns the summary. Raises DivergenceError
    (after writing the metrics so far and a summary saying so) when training blows up, Stopped on
    SIGTERM or SIGINT (after writing a summary with status "stopped"), ConfigError when the folder
    holds a run and neither ``overwrite`` nor ``resume`` is set, or another process writes it.
    ``transport``: this process's, for the threads backend (``run_threads``)."""
    if transport is not None:  # a process of the threads backend: run_threads claimed the folder
        return _run(resolved(cfg), progress, transport, None)
    # before the folder is claimed (and made); a bad --fault-tolerance is one line here. It fills in the
    # algorithm's --lr and --momentum where not given (config.json holds them), after asking the algorithm
    # whether --nesterov applies to it: a momentum filled in before would be refused first, as too small
    combination = check_combination(cfg)
    cfg, notes = combination.cfg, combination.notes
    if cfg.fault_tolerance != "none":  # a replica is up, its imports done (recovery is timed from here)
        import torchft  # noqa: F401 - the last of its imports, 0.1-1.4 s on this machine (checked: installed)

        print(f"gradwire run: replica starting ({cfg.fault_tolerance})", file=sys.stderr, flush=True)
    _refuse_one_process_backend_under_torchrun(cfg)
    writer = cfg.backend != "torch" or os.environ.get("RANK", "0") == "0"  # the others must not lock
    # the lock first: a folder another process is writing is said to be that, not judged by its files
    lock = claim(cfg.out, overwrite=cfg.overwrite, resume=cfg.resuming, replacing=cfg.resume_or_start) \
        if writer else None
    try:
        check_resume(cfg, existed=None if lock is None else not lock.created)  # every process: they all see it
    except BaseException:
        if lock is not None:
            lock.discard()  # refused: the lock file (and folder) the claim made go again
        raise
    for text in notes if writer else ():
        print(f"gradwire run: note: {text}", file=sys.stderr, flush=True)
    # the simulator and the threads backend stop between steps (the threads: the main thread hears the
    # signal, the loops stop); the simulator checkpoints the step reached, where the state is whole
    signals = StopSignals(deferred=cfg.backend != "torch", checkpoints=cfg.backend == "sim")
    failed = False  # not refused nor stopped: a restarted attempt may follow, without --overwrite
    try:
        signals.install()
        if cfg.backend == "threads":
            return run_threads(cfg, progress=progress, signals=signals)
        return _run(cfg, progress, None, signals)
    except (ConfigError, Stopped, AlreadyFinished):
        raise
    except BaseException:
        failed = True
        raise
    finally:
        signals.restore()
        if lock is not None:
            lock.release(restore=not failed)


def check_resume(cfg: RunConfig, *, existed: bool | None = None) -> None:
    """``--resume`` and ``--resume-or-start``, before anything is written: a run that finished
    ``--steps`` steps raises AlreadyFinished (nothing to do, nothing rewritten); a folder without a
    checkpoint is a ConfigError for ``--resume`` (a mistyped --out must not start a long run from
    step 0 unnoticed), and ``--resume-or-start`` starts there from step 0, unless the folder holds a
    finished run: starting again would replace it, which only --overwrite may ask (an unfinished
    run without a checkpoint is what a restarted attempt of ``launch --max-restarts`` finds, and
    starts again). ``existed``: whether the folder was there before this process's claim made it
    (None: whether it is there now)."""
    if not cfg.resuming or cfg.overwrite:  # (both: claim refuses the pair)
        return
    if cfg.resume and cfg.resume_or_start:
        raise ConfigError("--resume refuses a folder with nothing to resume and --resume-or-start starts one from "
                          "step 0: pass one of them (--resume)")
    out = Path(cfg.out)
    summary = read_json_or_empty(out / "summary.json")
    ran = read_json_or_empty(out / "config.json")
    changed = [k for k, v in cfg.to_dict().items() if k in checkpoint.MUST_MATCH and ran.get(k, v) != v]
    same = not changed
    stepdir = checkpoint.latest(out / "checkpoint")
    saved = stepdir is not None
    finished = summary.get("status") == "finished"
    done = summary.get("steps")
    # (a checkpoint past --steps is refused by its load, naming its step)
    if finished and isinstance(done, int) and done > cfg.steps and saved and checkpoint.step_of(stepdir) <= cfg.steps:
        # resuming from its checkpoint would rewrite every row after it and end at --steps: the run cut short
        raise ConfigError(f"steps={cfg.steps}: run folder {out} holds a run that finished at step {done}, more "
                          f"than --steps {cfg.steps}; resuming would cut it short and drop its rows after its "
                          f"checkpoint: pass --steps {done} or more to continue it, --overwrite to replace it, or "
                          "choose another --out (--steps)")
    if finished and done == cfg.steps and same:
        raise AlreadyFinished(str(out), summary, continuable=saved)  # (another configuration: the checkpoint names it)
    if saved:
        return
    if finished and changed:  # (with a checkpoint, its load names them)
        settings = "; ".join(f"{k}: {ran[k]!r} there vs {getattr(cfg, k)!r} now" for k in changed)
        raise ConfigError(f"run folder {out} holds a run that finished at step {done} with other settings "
                          f"({settings}) and saved no checkpoint to continue it from; starting again from step 0 "
                          "would replace it: give its settings to keep it, pass --overwrite to replace it, or choose "
                          f"another --out (--{changed[0].replace('_', '-')})")
    if finished:
        key = "resume_or_start" if cfg.resume_or_start else "resume"
        raise NoCheckpointToContinue(
            f"{key}=true: run folder {out} holds a run that finished at step {done} and saved no checkpoint to "
            "continue it from; starting again from step 0 would replace it: pass --overwrite to replace it, or "
            f"choose another --out (--{key.replace('_', '-')})", steps=done)
    if cfg.resume_or_start:
        return
    found = holds_run(out)
    there = out.is_dir() if existed is None else existed
    what = (f"holds a run ({found}) but no checkpoint to continue it (checkpoint/latest; --checkpoint-every K "
            "saves one)" if found else "holds no run" if there else "does not exist")
    raise ConfigError(f"resume=true: nothing to resume: run folder {out} {what}; check --out, or pass "
                      "--resume-or-start to start from step 0 when there is no checkpoint (--resume)")


def _run(cfg: RunConfig, progress: bool | None, transport: Transport | None, signals: StopSignals | None) -> dict:
    """Build the run, resume it if asked, and hand it to its driver, which runs the loop below
    (every process but a server-mode worker's, which runs its own: servers/real.py)."""
    started = time.perf_counter()
    r = Run(cfg, transport)
    resumed = cfg.resuming and r.resume()
    timeline = r.record_timeline(Path(cfg.out), resumed)
    return r.driver.train(lambda: _train(r, resumed, timeline, progress, signals, started))


def _train(r: Run, resumed: bool, timeline: Timeline, progress: bool | None, signals: StopSignals | None,
           started: float) -> dict:
    """The run loop: steps, evaluations, checkpoints, progress, and the summary at the end."""
    cfg = r.cfg
    mode, interval = progress_mode(progress)
    if not r.is_writer:
        mode = None
    folder = open_run_folder(r, resumed)
    evaluator = Evaluator(r, folder)
    records = folder.records
    status, error, stopped = "finished", None, None
    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=r.step, desc=cfg.label(), disable=mode != "bar", leave=False,
               dynamic_ncols=True)
    lines = ProgressLines(cfg.label(), cfg.steps, interval, started) if mode == "lines" else None
    if not resumed:  # step 0's evaluation (a --fault-tolerance replica's only at the job's start)
        r.driver.start(lambda: evaluator.record({}))
    try:
        while r.step < cfg.steps:
            if signals is not None and signals.pending is not None:  # between steps: the state is whole
                if signals.checkpoints and cfg.checkpoint_every and r.step % cfg.checkpoint_every:  # (else saved)
                    r.save_checkpoint()
                signals.stop_now()
            info = r.train_step()
            folder.step({"step": r.step, "sim_time_s": r.clock.now, "bytes_sent": r.transport.bytes_sent} | info)
            timeline.flush()  # the step's intervals: a crash loses at most the step under way
            bar.update(1)
            if r.algorithm.evaluates_at(r.step, cfg.eval_every, cfg.steps):
                r.driver.before_evaluation()  # every process, at the same steps
                evaluator.record({k: v for k, v in info.items() if k not in ("loss", "gradients")})
                if r.step < cfg.steps or r.algorithm.evaluates_at(r.step, cfg.eval_every, NO_LAST_STEP):
                    # (an evaluation only because this is the last step keeps its window in the
                    # checkpoint: a continuation to more --steps then reports the batch_loss of a
                    # run made that long at once)
                    r.window.clear()
                if records:
                    bar.set_postfix(loss=f"{records[-1]['train_loss']:.4g}", acc=f"{records[-1]['test_acc']:.3f}")
            if cfg.checkpoint_every and r.step % cfg.checkpoint_every == 0:
                r.save_checkpoint()
            r.fault_point(r.step, "step")
            if lines is not None:
                lines.tick(r.step, records, r.transport.bytes_sent)
    except DivergenceError as e:
        status, error = "diverged", str(e)
        raise
    except KeyboardInterrupt as e:  # SIGTERM or SIGINT (Stopped), or a Ctrl-C nobody handled
        stopped = e if isinstance(e, Stopped) else Stopped(signal.SIGINT)
        status, error = "stopped", f"stopped by {signal.Signals(stopped.signum).name} at step {r.step}"
        raise stopped from None
    except CommunicationError as e:
        if signals is None or signals.pending is None:
            status, error = "failed", f"{type(e).__name__}: {e}"
            raise
        # a stop asked while another process (threads) stopped first: its collective failed for the stop
        stopped = Stopped(signals.pending)
        status, error = "stopped", f"stopped by {signal.Signals(stopped.signum).name} at step {r.step}"
        raise stopped from None
    except BaseException as e:  # a bad checkpoint, a bug: say so
        status, error = "failed", f"{type(e).__name__}: {e}"
        raise
    finally:
        if signals is not None:  # the loop is over, whatever ended it: a signal from here on (torchrun's
            signals.stopping = True  # SIGTERM after a peer died) must not replace the ending with a stop
        r.algorithm.close()
        bar.close()
        timeline.close()
        if lines is not None:
            lines.tick(r.step, records, r.transport.bytes_sent, force=True)
        extra, finish_error = {}, None
        trained_bytes = r.transport.bytes_sent  # the training's: every backend counts the same
        if stopped is not None:
            extra = stop_record(cfg, stopped, r.step, r.is_writer)
        if status == "finished":
            try:  # the driver's end (a real server's goodbyes): a failure there still gets a summary
                extra = r.driver.finish()
            except Exception as e:  # noqa: BLE001 - re-raised below, once the summary is written
                status, error, finish_error = "failed", f"{type(e).__name__}: {e}", e
        result = summary(r, folder, status, error, resumed, extra, trained_bytes)
        folder.finish(result, cfg.label())
        try:  # leave the process group, and a replica its Lighthouse, on every path (gloo's threads
            r.transport.close()  # abort the process otherwise; a Manager would go on heartbeating)
        except Exception:
            if status == "finished" and finish_error is None:
                raise
        if finish_error is not None:
            raise finish_error
    return result
