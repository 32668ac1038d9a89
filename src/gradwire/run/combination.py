"""The second stage of validation: whether a config's values work together, asked of the
components that will run them.

The first stage, ``RunConfig.validate`` (gradwire/config.py), checks every value and every name
on its own and imports no layer above the config. :func:`check_combination` takes a config through
it, then asks the components what they support, each answer declared on its class: the algorithm
(``needs_server``, ``carries_rounds``, ``averages_during_backward``, ``default_compressor``,
``evaluated_rounds``: a run that ends before its first round would evaluate the initial model, and its
``default_lr``, ``default_momentum``, ``default_lr_schedule`` and ``default_lr_on_task`` for
:func:`resolved`), the learning-rate schedule (a warm-up that fits in the steps), the kernel sets
(whether Triton can run here), the task (the transformer that tensor parallelism splits, and the
layout's fit: ``gradwire.parallel.layout``) and the fault-tolerance spec (``transports/ft_spec.py``).

It lives in run/ because run/ is the layer that builds all of these; the run, ``run_threads``,
``gradwire launch``, ``gradwire plan`` and ``gradwire compare`` sit at or above it and call it,
once each, before they start anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gradwire import kernels
from gradwire.algorithms import ALGORITHMS
from gradwire.algorithms.base import Algorithm, Rounds
from gradwire.algorithms.optim import lr_schedule
from gradwire.config import RunConfig, naming_flag, parse_layout
from gradwire.errors import ConfigError
from gradwire.parallel.layout import check_full_batch, check_layout
from gradwire.spec import parse_spec
from gradwire.tasks import build_partition, build_task
from gradwire.tasks.base import check_task, default_lr_scale
from gradwire.tasks.language import transformer_sizes
from gradwire.transports import ft_spec


@dataclass(frozen=True)
class Combination:
    """A config that passed both stages, and what its algorithm told the check."""

    cfg: RunConfig      # --lr, --momentum, --lr-schedule filled in (the algorithm's defaults where not given)
    needs_server: bool  # a server takes part: a process of its own on a real backend
    notes: tuple[str, ...] = ()  # what the run does that the user may not expect (gradwire run prints them)

    @property
    def processes(self) -> int:
        """The processes a run on a real backend needs (``RunConfig.processes``)."""
        return self.cfg.processes(self.needs_server)


def resolved(cfg: RunConfig) -> RunConfig:
    """``cfg`` with --lr, --momentum and --lr-schedule filled in where they were not given: the
    algorithm's own defaults (``Algorithm.default_lr``, ``default_momentum``, ``default_lr_schedule``,
    class attributes chosen so that each algorithm learns on the default task, docs/defaults.md), the
    learning rate times the task's ``default_lr_scale`` where the algorithm's --lr is a gradient step
    (``lr_scales_with_task``; mnist1d-mlp takes twice the step of most tasks), or the algorithm's own
    rate on a task it names (``default_lr_on_task``: Leader SGD's on mnist1d-mlp); learning rate and
    momentum only under --optimizer sgd. The algorithm is built to ask it: some specs choose the class
    (``easgd:async=true``)."""
    if cfg.lr is not None and cfg.momentum is not None and cfg.lr_schedule is not None:
        return cfg
    return _with_defaults_of(_algorithm(cfg), cfg)


def _algorithm(cfg: RunConfig) -> Algorithm:
    with naming_flag("algorithm"):  # its range checks (sync:backups=-1)
        return ALGORITHMS.build(cfg.algorithm)


def _with_defaults_of(algorithm: Algorithm, cfg: RunConfig) -> RunConfig:
    lr = algorithm.default_lr
    if cfg.lr is None and parse_spec(cfg.optimizer)[0] == "sgd":
        own = algorithm.default_lr_on_task.get(parse_spec(cfg.task)[0])  # the algorithm's own on a named task
        if own is not None:
            lr = own
        elif algorithm.lr_scales_with_task:
            with naming_flag("task"):
                lr *= default_lr_scale(cfg.task)  # the task's own scale of a gradient step (mnist1d-mlp: 2)
    return cfg.with_defaults(default_lr=lr, default_momentum=algorithm.default_momentum,
                             default_lr_schedule=algorithm.default_lr_schedule)


class TooFewWorkers(ConfigError):
    """The algorithm's spec needs more workers than ``--workers`` gives (``sync:backups=2`` on 2):
    ``gradwire plan`` leaves that worker count out for the candidate rather than refuse the plan."""


def check_combination(cfg: RunConfig, *, workers_counted: bool = True) -> Combination:
    """Both stages of validation for ``cfg``: its values and names (``RunConfig.validate``), then
    whether they work together; ConfigError, one line naming the value and its flag, otherwise.
    ``workers_counted=False``: ``cfg.workers`` is a stand-in (``gradwire launch`` counts them from the
    processes later), so the algorithm's need of workers is not checked against it."""
    algorithm = _algorithm(cfg.validate())  # built once (its answers can depend on its spec)
    cfg = _with_defaults_of(algorithm, cfg)
    if workers_counted:
        _check_workers(cfg, algorithm)
    _check_kernels(cfg)
    with naming_flag("task"):
        check_task(cfg.task, num_workers=cfg.workers)  # its parameters' ranges, before any data is loaded
    if cfg.error_feedback and cfg.compressor == "none" and algorithm.default_compressor == "none":
        # it compresses only what --compressor names (sync, async); one with a compressor of its own
        # (dqgd, dagc) uses error feedback without the flag, and the others refuse it themselves
        raise ConfigError(f"--error-feedback needs --compressor: algorithm {cfg.algorithm!r} sends uncompressed "
                          "gradients without one, so there is no compression error to feed back (e.g. "
                          "--compressor topk:ratio=0.01 --error-feedback)")
    if cfg.compressed_mean == "scatter" and not algorithm.scatters_mean:
        able = [n for n in ALGORITHMS.names() if getattr(ALGORITHMS.entry(n).factory, "scatters_mean", False)]
        raise ConfigError(f"compressed_mean=scatter: algorithm {cfg.algorithm!r} does not average through the "
                          f"compressed mean's own collectives; the scatter route applies to {', '.join(able)} "
                          "(sync without backups) (--compressed-mean)")
    if cfg.compressed_mean == "scatter" and cfg.fault_tolerance != "none":
        raise ConfigError("compressed_mean=scatter needs an all-to-all among a fixed set of workers, which "
                          "--fault-tolerance's quorums do not have (--compressed-mean gather)")
    if cfg.nesterov and algorithm.nesterov_instead is not None:  # before asking for a --momentum
        raise ConfigError(f"nesterov=true: --nesterov does not apply to algorithm {cfg.algorithm!r} (leave it off): "
                          f"{algorithm.nesterov_instead} (--nesterov)")
    if cfg.nesterov and cfg.momentum == 0:  # given as 0, or the algorithm's own (sync's): here, not in the first
        # stage, so that an algorithm --nesterov does not apply to is said first (diloco --momentum 0 --nesterov)
        raise ConfigError("nesterov=true needs momentum > 0 (--momentum 0.9 --nesterov), got momentum=0 (--nesterov)")
    with naming_flag("lr_schedule"):
        lr_schedule(cfg.lr_schedule, cfg.steps, algorithm.schedule_updates_per_step)  # a warm-up that fits
    notes = _check_rounds(cfg, algorithm.evaluated_rounds()) + algorithm.combination_notes(cfg.compressor)
    cfg.check_values()  # the algorithm's defaults of --lr, --momentum and --lr-schedule with the rest
    if cfg.tensor_parallel:
        with naming_flag("tensor_parallel"):
            _check_tensor_parallel(cfg, algorithm)
    if cfg.fault_tolerance != "none":  # docs/fault_tolerance.md
        with naming_flag("fault_tolerance"):
            ft_spec.check(cfg.fault_tolerance, workers=cfg.workers, backend=cfg.backend,
                          step_timeout_s=cfg.timeout_s, needs_server=algorithm.needs_server,
                          tensor_parallel=cfg.tensor_parallel, carries_rounds=algorithm.carries_rounds)
    return Combination(cfg, algorithm.needs_server, notes)


def _check_workers(cfg: RunConfig, algorithm: Algorithm) -> None:
    """Backup workers leave at least one worker to aggregate (``sync:backups=b``,
    ``backup-diloco:backups=b``): the algorithm checks it only in its set-up, once the run is built
    (on a real backend, once every process has started), so a comparison or a launch found it
    only after starting (``Algorithm.min_workers``, declared by its spec)."""
    fewest = algorithm.min_workers()
    if cfg.workers < fewest:
        raise TooFewWorkers(f"algorithm={cfg.algorithm!r}: backups={fewest - 1} leaves no worker to aggregate with "
                            f"{cfg.workers} worker{'s' if cfg.workers != 1 else ''}: backups must be fewer than "
                            "--workers (--algorithm)")


def _check_rounds(cfg: RunConfig, rounds: Rounds | None) -> tuple[str, ...]:
    """An algorithm whose evaluated parameters change only at its rounds (``Algorithm.evaluated_rounds``:
    DiLoCo's θ, local SGD's last average): a run that ends before its first round completes would
    evaluate the initial model, refused as an --lr that rounds to 0 is; a run whose last round is
    incomplete (``--algorithm diloco --steps 25``, H = 20) computes steps that never reach the evaluated
    model, which the note returned says."""
    if rounds is None:
        return ()
    if cfg.steps < rounds.first:
        raise ConfigError(f"steps={cfg.steps} < {rounds.first_is}: no {rounds.round} of algorithm {cfg.algorithm!r} "
                          f"would complete, and the model it evaluates changes only at its {rounds.round}s (it would "
                          f"be the initial one); raise --steps to {rounds.first} or more, or {rounds.remedy} (--steps)")
    last = rounds.last_change(cfg.steps)
    if last == cfg.steps:
        return ()
    reached = last - rounds.delay  # the last step whose work the evaluated model holds
    lost = cfg.steps - reached
    return (f"the last {rounds.round} of algorithm {cfg.algorithm!r} is incomplete: its {lost} "
            f"step{'s' if lost > 1 else ''} after step {reached} will not reach the evaluated model, which changes "
            f"only at {rounds.round}s (this run's last after step {last}); --steps {last} or {last + rounds.period} "
            "ends on one" + (f" (the {rounds.delay} step{'s' if rounds.delay > 1 else ''} computed while it travels "
                             f"stay{'' if rounds.delay > 1 else 's'} outside it, as at the end of every overlapped "
                             "run)" if rounds.delay else ""),)


def check_started_here(cfg: RunConfig) -> None:
    """A run that this process starts itself (``gradwire compare``'s variants): ``--backend torch``
    needs the environment torchrun gives each process (the torch backend finds it missing only
    once the run is built)."""
    if cfg.backend == "torch" and "WORLD_SIZE" not in os.environ:
        raise ConfigError(f"backend='torch' runs one process per worker, started by torchrun, but {cfg.label()!r} "
                          "would run in this process: use --backend sim or threads here, or run it with "
                          "`gradwire launch --nproc-per-node N -- run ...` (--backend)")


def _check_kernels(cfg: RunConfig) -> None:
    """The kernel set can run here: triton needs Triton installed and, on the CPU, its interpreter."""
    with naming_flag("kernels"):
        kernels.check(cfg.kernels, "kernels")
    if cfg.kernels == "triton" and cfg.device == "cpu" and not kernels.interpreting():
        raise ConfigError("kernels='triton' with device='cpu' runs only under Triton's interpreter "
                          "(TRITON_INTERPRET=1, slow: for tests); use --kernels torch on the CPU (--kernels)")


def _check_tensor_parallel(cfg: RunConfig, algorithm: Algorithm) -> None:
    """The layout runs on the torch backend without a server, and splits the task's transformer
    (docs/tensor_parallel.md); the process count is checked when the run starts."""
    spec = cfg.tensor_parallel
    if cfg.backend != "torch":
        raise ConfigError(f"tensor_parallel={spec!r} needs --backend torch (gradwire launch "
                          f"--nproc-per-node WORKERSxP -- run ...), not --backend {cfg.backend} (--tensor-parallel)")
    if algorithm.needs_server:
        raise ConfigError(f"tensor_parallel={spec!r}: algorithm {cfg.algorithm!r} has a server; "
                          "tensor parallelism runs with the collective algorithms only (--tensor-parallel)")
    if algorithm.averages_during_backward:
        # its communication thread would issue the data-parallel collectives while the backward pass
        # issues the tensor-parallel ones, in an order that differs between ranks (NCCL can hang)
        raise ConfigError(f"tensor_parallel={spec!r}: algorithm {cfg.algorithm!r} averages during "
                          "the backward pass, which also runs the tensor-parallel collectives; use overlap=false "
                          "(--tensor-parallel)")
    # Muon orthogonalises each weight matrix whole (Newton-Schulz), but a process holds a block of it
    # (SUMMA's transposed), so its rows and columns would be scaled block by block
    if parse_spec(cfg.optimizer)[0] == "muon":
        raise ConfigError(f"tensor_parallel={spec!r}: --optimizer {cfg.optimizer!r} orthogonalises each weight "
                          "matrix whole, but each process holds only a block of it; use --optimizer sgd or adamw "
                          "(--tensor-parallel)")
    if algorithm.updates_whole_matrices:
        raise ConfigError(f"tensor_parallel={spec!r}: algorithm {cfg.algorithm!r} updates each weight matrix "
                          "whole (Muon), but each process holds only a block of it; use diloco (inner=adamw or sgd) "
                          "(--tensor-parallel)")
    sizes = transformer_sizes(cfg.task)
    layout, full = parse_layout(spec), cfg.batch_size == "full"
    check_layout(layout, world_size=cfg.processes(server=False), dim=sizes["dim"], heads=sizes["heads"],
                 vocab=sizes["vocab"], batch=None if full else int(cfg.batch_size))
    if full and layout.summa:  # each worker's batch is its shard, split d*q ways
        check_full_batch(layout, _shard_sizes(cfg))


def _shard_sizes(cfg: RunConfig) -> list[int]:
    """Each worker's number of training samples as the run splits them (``Run`` in run/loop.py): the
    task's own split, else the partition's. This loads the task's data, so only the check that needs
    the sizes asks (a full batch under 2-D / 2.5-D)."""
    task = build_task(cfg.task, num_workers=cfg.workers, seed=cfg.seed, data_dir=cfg.data_dir)
    shards = task.worker_indices
    if shards is None:
        with naming_flag("partition"):
            shards = build_partition(cfg.partition, labels=task.partition_labels(), num_workers=cfg.workers,
                                     seed=cfg.seed)
    return [len(s) for s in shards]
