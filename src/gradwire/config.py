"""The run configuration: one typed record, validated at the edge, written into every run folder.

Every key can come from a YAML or TOML file (``--config``) and from a flag of the same name
(dashes for underscores); flags override the file.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import struct
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gradwire.errors import ConfigError
from gradwire.registries import REGISTRIES, check_spec_names, registry_for
from gradwire.spec import BOOL_SPELLINGS, parse_bool, parse_spec

COMPRESSED_MEANS = ("gather", "scatter")  # --compressed-mean (averaging/compressed.py's routes)
OUTER_STATES = ("device", "cpu")  # where the DiLoCo family keeps its outer state (--outer-state)
KERNEL_SETS = ("torch", "triton")  # codec kernels (--kernels; gradwire.kernels runs them)
BACKENDS = ("sim", "torch", "threads")
DEVICES = ("cpu", "cuda")
LAYOUTS = "1d:p=P | 2d:q=Q | 2.5d:q=Q,d=D"  # --tensor-parallel (docs/tensor_parallel.md)


@dataclass
class RunConfig:
    task: str = "mnist1d-mlp"                 # task spec: data + model (gradwire list tasks)
    workers: int = 8                          # number of workers (world_size)
    algorithm: str = "sync"                   # algorithm spec, e.g. sync:backups=2, async, diana
    compressor: str = "none"                  # compressor spec for the workers' payloads
    error_feedback: bool = False              # keep per-worker compression residuals
    compressed_mean: str = "gather"           # gather: every worker decodes every message; scatter: worker j
                                              # averages chunk j of all and sends it on compressed again (1-bit
                                              # Adam's compressed allreduce: 2(n-1)/n messages a link, not n-1;
                                              # compressed twice, which can cost quality: docs/compressors.md)
    owner_compressor: str = ""                # scatter: the codec the owners' chunk means travel in, e.g. more
                                              # bits for the one message every worker receives
    partition: str = "iid"                    # how the training data is split among workers
    stragglers: str = "none"                  # per-worker compute-time model (simulated seconds)
    network: str = "ps:mbps=100,latency_ms=1" # network model: who sends what, at what cost
    backend: str = "sim"                      # sim: simulated cluster; torch: torch.distributed; threads: its dry run
    device: str = "cpu"                       # where workers compute: cpu, or cuda (torch: NCCL, a GPU per local rank)
    kernels: str = "torch"                    # codec kernels: torch (reference) or triton (fused: docs/gpu.md)
    outer_state: str = "device"               # DiLoCo family: θ, outer momentum, residuals on device, or cpu (pinned)
    tensor_parallel: str = ""                 # 1d:p=4 | 2d:q=2 | 2.5d:q=2,d=2: the model split over P processes/worker

    steps: int = 500                          # algorithm steps: one gradient per worker each for most (in the
                                              # DiLoCo family and local SGD an inner, local step); one outer
                                              # round each for backup-diloco and async-diloco (H inner steps
                                              # a replica), and dagc:local_steps=K (K local steps)
    batch_size: int | str = 32                # per-worker minibatch, or "full" for the whole local shard
    lr: float | None = None                   # step size γ (left out: the algorithm's, task-scaled: docs/defaults.md)
    optimizer: str = "sgd"                    # update rule: sgd (heavy ball), adamw or muon (their keys: gradwire list)
    lr_schedule: str | None = None            # lr over the run: constant, cosine or linear:warmup=W,min_ratio=R
    #                                           (left out: the algorithm's, constant for most: docs/defaults.md)
    momentum: float | None = None             # heavy-ball momentum β (left out: the algorithm's own)
    nesterov: bool = False                    # Nesterov momentum (as torch.optim.SGD's); needs momentum > 0
    weight_decay: float = 0.0                 # weight decay: added to the gradient (sgd), decoupled (adamw)
    dtype: str = "float32"                    # float32 or float64, end to end
    eval_every: int = 50                      # evaluate every E steps (and at the last)
    seed: int = 0                             # one seed for model init, data order, stragglers, compression
    out: str = "runs/run"                     # run folder
    name: str = ""                            # label in reports
    data_dir: str = "data-cache"              # where generated datasets are cached
    threads: int = 1                          # torch intra-op threads (the simulator runs many tiny ops)
    timeout_s: float = 120.0                  # real backends: longest wait on any peer before failing
    checkpoint_every: int = 0                 # save a checkpoint every K steps into OUT/checkpoint (0 = never)
    resume: bool = False                      # continue from OUT/checkpoint/latest (refused when there is none)
    resume_or_start: bool = False             # continue from OUT/checkpoint/latest, or start at step 0 without one
    overwrite: bool = False                   # replace the run already in OUT (its files and checkpoint/)
    tensorboard: bool = False                 # also write the scalars to OUT/tensorboard (needs tensorboard)
    curves: bool = True                       # draw OUT/curves.png at the end (--no-curves: gradwire report can, later)
    fault_tolerance: str = "none"             # torchft:min_replicas=N,timeout_s=S, lighthouse=HOST:PORT, replica=K

    def label(self) -> str:
        if self.name:
            return self.name
        text = self.algorithm
        if self.compressor != "none":
            text += f" + {self.compressor}" + (" + EF" if self.error_feedback else "")
            text += (f" (scatter, owners {self.owner_compressor})" if self.owner_compressor else " (scatter)") \
                if self.compressed_mean == "scatter" else ""
        return text

    def with_defaults(self, *, default_lr: float, default_momentum: float, default_lr_schedule: str) -> RunConfig:
        """This config with --lr, --momentum and --lr-schedule filled in where they were not given, from
        the algorithm's own defaults (``gradwire.run.combination.resolved`` asks the algorithm's class);
        momentum only under --optimizer sgd."""
        sgd = parse_spec(self.optimizer)[0] == "sgd"
        return self.replace(lr=default_lr if self.lr is None else self.lr,
                            momentum=(default_momentum if sgd else 0.0) if self.momentum is None else self.momentum,
                            lr_schedule=default_lr_schedule if self.lr_schedule is None else self.lr_schedule)

    def tensor_parallel_size(self) -> int:
        """P, the processes that hold one worker's model (1 without --tensor-parallel)."""
        if not self.tensor_parallel:
            return 1
        return parse_layout(self.tensor_parallel).size

    def processes(self, server: bool) -> int:
        """The processes a run on a real backend needs: workers x P (each worker's model split over
        P processes), plus one, process 0, for the server of a server-mode algorithm (``server``:
        whether the algorithm has one). The one place this rule is written."""
        return self.workers * self.tensor_parallel_size() + int(server)

    def workers_for(self, processes: int, server: bool) -> tuple[int, int]:
        """The same rule read backwards: (the workers that ``processes`` processes make, the
        processes left over)."""
        return divmod(processes - int(server), self.tensor_parallel_size())

    @property
    def resuming(self) -> bool:
        """Whether the run continues from OUT/checkpoint (--resume or --resume-or-start)."""
        return self.resume or self.resume_or_start

    def validate(self) -> RunConfig:
        """The first stage of validation: every value and every name, each on its own; raise
        ConfigError naming the bad one. Every message has one form: ``key=value`` and the problem,
        then the flag, ``(--key)``. The checks that need no registry come first: they import no
        torch, so a mistyped number is reported at once (the registries' modules import torch).
        Whether the values work together (an algorithm with a layout, a schedule with the steps,
        the kernels on this machine) is the second stage, ``gradwire.run.combination``, which asks
        the components. After ``check_values``, each spec is resolved (or built) in its registry,
        whose module the registries' table imports by name (docs/ARCHITECTURE.md); nothing here
        imports a layer above the config directly."""
        self.check_values()
        if self.kernels not in KERNEL_SETS:
            raise ConfigError(f"kernels={self.kernels!r}: valid choices are {', '.join(KERNEL_SETS)} "
                              f"{_flag('kernels')}")
        if self.compressed_mean not in COMPRESSED_MEANS:
            raise ConfigError(f"compressed_mean={self.compressed_mean!r}: valid choices are "
                              f"{', '.join(COMPRESSED_MEANS)} (--compressed-mean)")
        if self.owner_compressor:
            if self.compressed_mean != "scatter":
                raise ConfigError(f"owner_compressor={self.owner_compressor!r} is the codec of the chunk owners' "
                                  "messages, which only --compressed-mean scatter sends (--owner-compressor)")
            with naming_flag("owner_compressor"):
                ref = registry_for("compressor", self.owner_compressor)
                if ref.group != "compressors":
                    raise ConfigError(f"owner_compressor={self.owner_compressor!r}: the owners' messages are a "
                                      "byte compressor's (gradwire list compressors), not an averager's")
                ref.registry.build(self.owner_compressor)
        if self.outer_state not in OUTER_STATES:
            raise ConfigError(f"outer_state={self.outer_state!r}: valid choices are {', '.join(OUTER_STATES)} "
                              "(--outer-state)")
        if self.tensor_parallel:
            with naming_flag("tensor_parallel"):
                parse_layout(self.tensor_parallel)
        # names and keys first, then the range checks of the cheap ones; a key that several registries
        # share (compressor) is checked against the one that holds its name
        chosen = []
        for key in dict.fromkeys(ref.key for ref in REGISTRIES):
            if getattr(self, key) is None:  # the algorithm's (lr_schedule), checked once resolved
                continue
            with naming_flag(key):
                chosen.append(ref := registry_for(key, getattr(self, key)))
                ref.registry.resolve(getattr(self, key))
        for ref in chosen:
            if ref.build_to_validate:
                with naming_flag(ref.key):
                    ref.registry.build(getattr(self, ref.key))
        _check_device(self.device)
        if self.tensorboard:
            from gradwire.report.tensorboard import require_tensorboard

            require_tensorboard()
        return self

    def check_types(self) -> None:
        """The numbers and switches are of their field's type (the command line and config files
        convert them with :func:`coerce`; a RunConfig made in Python may hold anything): a flag's
        "yes" or a step count's "10" is refused in one line, not a TypeError or a silent True."""
        for key, f in KEYS.items():
            value, default = getattr(self, key), f.default
            if key == "batch_size" and value == "full":
                continue
            if isinstance(default, bool):  # (numpy's bool is no subclass of bool)
                ok = isinstance(value, bool) or (type(value).__module__, type(value).__name__) in (("numpy", "bool"),
                                                                                                  ("numpy", "bool_"))
            elif isinstance(default, int) or key == "batch_size":
                ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
            elif isinstance(default, float) or (default is None and key in ("lr", "momentum")):
                ok = (value is None and default is None) or (isinstance(value, numbers.Real)
                                                             and not isinstance(value, bool))
            else:
                continue
            if not ok:
                kind = "bool" if isinstance(default, bool) else "integer" if isinstance(default, int) else "number"
                raise ConfigError(f"{key}={value!r} is not a valid {kind} {_flag(key)}")

    def check_values(self) -> RunConfig:
        """The checks of :meth:`validate` that need no registry and no torch: the values, and the
        specs' names and keys against the written-down table (``registries.check_spec_names``)."""
        self.check_types()
        _positive(self.workers, "workers")
        _positive(self.steps, "steps")
        _positive(self.eval_every, "eval_every")
        _positive(self.threads, "threads")
        if isinstance(self.batch_size, str):
            if self.batch_size != "full":
                raise ConfigError(f"batch_size={self.batch_size!r}: expected a positive integer or 'full' "
                                  f"{_flag('batch_size')}")
        else:
            _positive(self.batch_size, "batch_size")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype={self.dtype!r}: valid choices are float32, float64 {_flag('dtype')}")
        if self.lr is not None:  # (None: the algorithm's default, checked once resolved)
            _step_size(self.lr, "lr", self.dtype, positive=True)
        if self.momentum is not None and not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum={self.momentum} must be in [0, 1) {_flag('momentum')}")
        if self.nesterov and parse_spec(self.optimizer)[0] != "sgd":  # before asking for a --momentum it refuses
            own = " (Muon's Nesterov form is its spec's: muon:nesterov=true, the default)" \
                if parse_spec(self.optimizer)[0] == "muon" else ""
            raise ConfigError(f"nesterov=true applies to --optimizer sgd's momentum; --optimizer {self.optimizer!r} "
                              f"keeps its own moments{own} (leave --nesterov off, or use --optimizer sgd --momentum "
                              f"0.9 --nesterov) {_flag('nesterov')}")
        _step_size(self.weight_decay, "weight_decay", self.dtype, positive=False)
        if self.momentum and parse_spec(self.optimizer)[0] != "sgd":
            raise ConfigError(f"momentum={self.momentum} applies to --optimizer sgd; --optimizer {self.optimizer!r} "
                              "keeps its own moments (leave --momentum at 0, or use --optimizer sgd) "
                              f"{_flag('momentum')}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed={self.seed} must be an integer in [0, 2**63) {_flag('seed')}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend={self.backend!r}: valid choices are {', '.join(BACKENDS)} {_flag('backend')}")
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r}: valid choices are {', '.join(DEVICES)} {_flag('device')}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every={self.checkpoint_every} must be >= 0 (0 = never) "
                              f"{_flag('checkpoint_every')}")
        if not 0 < self.timeout_s <= threading.TIMEOUT_MAX:  # waits overflow beyond it (Condition, timedelta)
            raise ConfigError(f"timeout_s={self.timeout_s} must be > 0 and finite, at most {threading.TIMEOUT_MAX:g} "
                              f"s {_flag('timeout_s')}")
        check_out_folder(self.out)
        for key in dict.fromkeys(ref.key for ref in REGISTRIES):  # names and keys, from the torch-free table
            if getattr(self, key) is None:  # the algorithm's (lr_schedule), checked once resolved
                continue
            with naming_flag(key):
                check_spec_names(key, getattr(self, key))
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)


KEYS = {f.name: f for f in fields(RunConfig)}
# config-file keys that only `gradwire compare` reads (every other key is a RunConfig field); the
# other commands take a comparison's file for its common keys (docs/leader_sgd.md does)
COMPARE_KEYS = ("variants", "seeds")
# how a run treats a folder that holds a run: one choice, so a flag given for it replaces the file's
FOLDER_MODE_KEYS = ("overwrite", "resume", "resume_or_start")


def _flag(key: str) -> str:
    """The flag of config key ``key``, as every message names it: ``(--batch-size)``."""
    return f"(--{key.replace('_', '-')})"


@contextmanager
def naming_flag(key: str) -> Iterator[None]:
    """A ConfigError raised inside ends with the flag of config key ``key``, as every message does
    (a component's own message names the bad value and the valid choices, not the flag)."""
    try:
        yield
    except ConfigError as e:
        if str(e).endswith(_flag(key)):
            raise
        raise ConfigError(f"{e} {_flag(key)}") from None


def coerce(key: str, value: Any) -> Any:
    """Convert a value from a file or flag to the field's type, naming the key on failure."""
    key = key.replace("-", "_")
    if key not in KEYS:
        raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(KEYS)} (each also a flag: --key-name), "
                          f"and gradwire compare's own: {', '.join(COMPARE_KEYS)} (at the top of its config file)")
    default = KEYS[key].default
    if default is None:  # given when left out by the algorithm (lr, momentum: a float; lr_schedule: a spec)
        default = "" if key == "lr_schedule" else 0.0
    try:
        if key == "batch_size":
            return "full" if str(value) == "full" else _int(value)
        if isinstance(default, bool):
            return parse_bool(value)
        if isinstance(default, int):
            return _int(value)
        if isinstance(default, float):
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        kind = "integer or 'full'" if key == "batch_size" else type(default).__name__
        kind += f": write {BOOL_SPELLINGS}" if isinstance(default, bool) else ""
        raise ConfigError(f"{key}={value!r} is not a valid {kind} {_flag(key)}") from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError
    return int(value)


def _step_size(value: float, key: str, dtype: str, *, positive: bool) -> None:
    """A float hyperparameter multiplied into the parameters: finite, > 0 (or >= 0), and
    representable in the training dtype (a larger one cannot even be applied: torch refuses to
    convert it to a float32 scale factor)."""
    bound = "> 0" if positive else ">= 0"
    if not math.isfinite(value) or not (value > 0 if positive else value >= 0):
        raise ConfigError(f"{key}={value} must be a finite number {bound} {_flag(key)}")
    largest = 3.4028234663852886e38 if dtype == "float32" else 1.7976931348623157e308
    if value > largest:
        raise ConfigError(f"{key}={value:g} is too large for dtype {dtype} (at most {largest:.4g}); a step that "
                          f"size cannot be applied {_flag(key)}")
    # a positive value below half the smallest float32 (about 1.4e-45) becomes 0 there: nothing trains
    # (a Python float is a float64 already, so none rounds to 0 under --dtype float64)
    if positive and dtype == "float32" and struct.unpack("<f", struct.pack("<f", value))[0] == 0.0:
        raise ConfigError(f"{key}={value:g} rounds to 0 in dtype {dtype} (its smallest positive number is about "
                          f"1.4e-45), so no step would change the model; pass a larger value or --dtype float64 "
                          f"{_flag(key)}")


def check_out_folder(out: str) -> None:
    """ConfigError unless ``out`` is a folder, or can be created as one, that this process can
    write into; creates nothing that stays (it tries a temporary folder, then removes it)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out={out!r} is an existing file, not a folder: name a folder for the run (--out)")
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"out={out!r} cannot be created: {str(parent)!r} is a file, not a folder (--out)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".gradwire-probe-", dir=parent))
    except OSError as e:
        where = "write into it" if parent == path else f"create folders in {str(parent)!r}"
        raise ConfigError(f"out={out!r} cannot be used: cannot {where} ({e.strerror}) (--out)") from None


def _check_device(device: str) -> None:
    """cpu or cuda, and cuda only where torch sees a GPU (never a silent fall back to the CPU)."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ConfigError(f"device='cuda': torch {torch.__version__} ({built}) sees no CUDA device here; "
                              "use --device cpu (--device)")


@dataclass(frozen=True)
class Layout:
    """A tensor-parallel layout: ``kind`` 1d (``size`` = p) or 2.5d (q, d; 2d is d = 1). A value of
    the config (its size is in the process count); ``gradwire.parallel.layout`` checks it against
    the model and the processes."""

    kind: str  # "1d", "2d" or "2.5d" as written
    p: int = 1  # 1d: ranks per group
    q: int = 1  # 2d / 2.5d: the SUMMA grid is q x q
    d: int = 1  # 2.5d: depth

    @property
    def size(self) -> int:
        """Processes per tensor-parallel group (P)."""
        return self.p if self.kind == "1d" else self.q * self.q * self.d

    @property
    def summa(self) -> bool:
        return self.kind != "1d"

    def spec(self) -> str:
        return {"1d": f"1d:p={self.p}", "2d": f"2d:q={self.q}"}.get(self.kind, f"2.5d:q={self.q},d={self.d}")


def parse_layout(text: str) -> Layout:
    """``1d:p=4``, ``2d:q=2`` or ``2.5d:q=2,d=2`` as a Layout; ConfigError naming the bad part."""
    name, raw = parse_spec(text)
    keys = {"1d": ("p",), "2d": ("q",), "2.5d": ("q", "d")}
    if name not in keys:
        raise ConfigError(f"tensor_parallel={text!r}: unknown layout {name!r}; valid: {LAYOUTS}")
    if set(raw) != set(keys[name]):
        raise ConfigError(f"tensor_parallel={text!r}: layout {name} takes exactly "
                          f"{', '.join(k + '=' for k in keys[name])} (valid: {LAYOUTS})")
    values = {}
    for k, v in raw.items():
        if not v.isdigit() or int(v) < 1:
            raise ConfigError(f"tensor_parallel={text!r}: {k}={v} must be a positive integer (valid: {LAYOUTS})")
        values[k] = int(v)
    return Layout(kind=name, **values)


def _positive(value: int, key: str) -> None:
    if value < 1:
        raise ConfigError(f"{key}={value} must be a positive integer {_flag(key)}")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Keys of a YAML (.yaml/.yml) or TOML (.toml) file; JSON is YAML too."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist or is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {str(path)!r}: {e}") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as e:  # the parsers' own errors name the line
        raise ConfigError(f"cannot parse config file {str(path)!r}: {_parser_message(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys to values")
    return data


def _parser_message(e: Exception) -> str:
    """A YAML or TOML parser's message on one line: where (line and column, 1-based, as editors
    count) and what, every part of it kept. PyYAML's own str() names ``<unicode string>`` (it was
    given text, not the file) and spreads over several lines."""
    problem = getattr(e, "problem", None)
    mark = getattr(e, "problem_mark", None)
    if problem is None or mark is None:  # TOML (its message names the line) or another YAML error
        return " ".join(str(e).split())
    context, began = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and began is not None:
        context += f" that starts at line {began.line + 1}, column {began.column + 1}"
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else "")


def from_mapping(data: dict[str, Any], base: RunConfig | None = None) -> RunConfig:
    cfg = base or RunConfig()
    return cfg.replace(**{k.replace("-", "_"): coerce(k, v) for k, v in data.items()})
