"""Every registered component runs on its defaults when named bare, and its spec() builds it again.

The names come from gradwire.registries, so a component added to any registry is covered without
touching this file. Algorithms run as a new user would start them: the bare name, every other
config key at its default except the small task, workers, steps and output folder.
"""

import json
import math

import pytest
import torch

from gradwire.compress.qsgd import QSGD
from gradwire.config import RunConfig
from gradwire.registries import REGISTRIES
from gradwire.run.combination import resolved
from gradwire.run.loop import run
from gradwire.spec import convert, format_value, spec_of
from gradwire.tasks.base import build_task
from gradwire.tasks.partition import build_partition
from tests.helpers import read_jsonl

REGISTRY = {ref.group: ref.registry for ref in REGISTRIES}


def names(group: str) -> list[str]:
    return REGISTRY[group].names()


def test_every_registry_is_covered():
    assert set(REGISTRY) == {"tasks", "partitions", "stragglers", "networks", "algorithms", "compressors",
                             "averagers", "optimizers", "lr-schedules"}


@pytest.mark.parametrize("name", names("algorithms"))
def test_algorithm_runs_bare(tmp_path, data_dir, name):
    # 20 steps: the longest first round of a bare algorithm (muloco's inner_steps), before which a run is refused
    cfg = RunConfig(task="digits-logreg", workers=4, steps=20, eval_every=20, algorithm=name,
                    out=str(tmp_path / name), data_dir=str(data_dir)).validate()
    summary = run(cfg, progress=False)
    assert summary["status"] == "finished", summary
    resolved = json.loads((tmp_path / name / "config.json").read_text())["algorithm_resolved"]
    entry, _ = REGISTRY["algorithms"].resolve(resolved)  # the recorded spec is a valid spec of the same one
    assert entry.name == name


@pytest.mark.parametrize("name", names("compressors"))
def test_compressor_round_trips_bare(name):
    comp = REGISTRY["compressors"].build(name)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    packet = comp.encode(x, generator=torch.Generator().manual_seed(1))
    y = comp.decode(packet)
    assert y.shape == x.shape and y.dtype == x.dtype and torch.isfinite(y).all()
    size = comp.nbytes(x.numel(), x.dtype)
    assert size is None or size == packet.nbytes
    assert comp.spec().split(":")[0] == name
    assert REGISTRY["compressors"].build(comp.spec()).spec() == comp.spec()


@pytest.mark.parametrize("name", names("networks"))
def test_network_prices_bare(name):
    net = REGISTRY["networks"].build(name)
    cost = net.allreduce(4000, 4)
    assert cost.bytes > 0 and cost.time_s > 0
    assert REGISTRY["networks"].build(net.spec()).spec() == net.spec()


@pytest.mark.parametrize("name", names("optimizers"))
def test_optimizer_runs_bare(tmp_path, data_dir, name):
    cfg = RunConfig(task="digits-logreg", workers=2, steps=2, eval_every=2, optimizer=name,
                    out=str(tmp_path / name), data_dir=str(data_dir)).validate()
    assert run(cfg, progress=False)["status"] == "finished"
    rule = REGISTRY["optimizers"].build(name)
    assert spec_of(rule).split(":")[0] == name
    assert spec_of(REGISTRY["optimizers"].build(spec_of(rule))) == spec_of(rule)


@pytest.mark.parametrize("name", names("lr-schedules"))
def test_lr_schedule_runs_bare(tmp_path, data_dir, name):
    cfg = resolved(RunConfig(task="digits-logreg", workers=2, steps=3, eval_every=3, lr_schedule=name,
                             out=str(tmp_path / name), data_dir=str(data_dir)))
    assert run(cfg, progress=False)["status"] == "finished"
    schedule = REGISTRY["lr-schedules"].build(name)
    factors = [schedule.factor(k, 3) for k in range(3)]
    assert factors[0] == 1.0 and all(0 <= f <= 1 for f in factors)  # bare: no warm-up, never above --lr
    last = read_jsonl(tmp_path / name / "metrics.jsonl")[-1]
    lr = cfg.lr  # --lr left out: the algorithm's default
    assert last.get("lr", lr) == pytest.approx(lr * factors[2])  # the run's last update used the rate
    assert spec_of(REGISTRY["lr-schedules"].build(spec_of(schedule))) == spec_of(schedule)


@pytest.mark.parametrize("name", names("stragglers"))
def test_straggler_model_draws_bare(name):
    model = REGISTRY["stragglers"].build(name, seed=0)
    times = model.times(4, 1)
    assert times.shape == (4,) and (times > 0).all()
    assert REGISTRY["stragglers"].build(model.spec(), seed=0).times(4, 1).tolist() == times.tolist()


@pytest.mark.parametrize("name", names("partitions"))
def test_partition_splits_bare(name):
    labels = torch.arange(400) % 10
    parts = build_partition(name, labels=labels, num_workers=4, seed=0)
    assert len(parts) == 4 and all(len(p) > 0 for p in parts)


@pytest.mark.parametrize("name", names("tasks"))
def test_task_builds_bare(data_dir, name):
    task = build_task(name, num_workers=4, seed=0, data_dir=data_dir)
    assert len(task.x_train) > 0 and len(task.x_train) == len(task.y_train)
    assert task.name.split(":")[0] == name
    model = task.model_fn(torch.Generator().manual_seed(0))
    assert math.isfinite(task.objective(model))


def test_spec_comes_from_the_registry_declaration():
    """spec() renders the entry's parameters in order, defaults filled in, whether the object was
    built from a spec or constructed directly; the run's seed is not part of a straggler spec."""
    assert REGISTRY["compressors"].build("qsgd:bucket=128").spec() == "qsgd:levels=7,bucket=128,format=2"
    assert QSGD(bucket=128, levels=3).spec() == "qsgd:levels=3,bucket=128,format=2"
    assert REGISTRY["stragglers"].build("slow:compute_s=0.5", seed=7).spec() == "slow:count=1,slowdown=3,compute_s=0.5"
    assert REGISTRY["networks"].build("ring").spec() == "ring:mbps=100,latency_ms=1"
    assert spec_of(REGISTRY["algorithms"].build("local:period=2")) == "local:period=2,eval=last_average"


@pytest.mark.parametrize("value", [True, False, 3, -1, 0.01, 100.0, 1e-05, 0.123456789, math.inf, "relative"])
def test_format_value_reads_back(value):
    assert convert(format_value(value), type(value), what="x") == value
