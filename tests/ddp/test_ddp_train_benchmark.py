"""benchmarks/ddp_train.py (the plain-DDP baseline of benchmarks/time_to_accuracy.py) trains the same
problem as ``gradwire run``: the same initial model, the same batches per rank, and, with SGD and
an averaged gradient (what DDP's allreduce gives), the same parameters as gradwire's ``sync``.
In process, no torch.distributed: DDP's allreduce is the mean of the ranks' gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gradwire.config import RunConfig
from gradwire.run.loop import Run
from tests import helpers

TASK = "stdlib-lm:context=16,dim=32,layers=1,heads=2,train_bytes=60000,val_bytes=2048"
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ddp_train.py"


def load_script():
    return helpers.load_script(SCRIPT, "ddp_train")


# (SGD: AdamW's m / sqrt(v) turns last-bit differences of near-zero gradients, from another order of
# floating-point sums in the module against gradwire's flat model, into differences of order lr)
@pytest.mark.parametrize("schedule", ["constant", "cosine:warmup=1,min_ratio=0.1"])
def test_ddp_script_trains_what_gradwire_sync_trains(tmp_path, schedule):
    ddp_train = load_script()
    world, steps = 2, 3
    cfg = RunConfig(task=TASK, workers=world, algorithm="sync", lr=0.05, momentum=0.9, batch_size=8, seed=0,
                    lr_schedule=schedule, steps=steps, out=str(tmp_path / "run"), data_dir=str(tmp_path / "data"))
    reference = Run(cfg)
    built = [ddp_train.build(TASK, world=world, rank=r, seed=0, batch_size=8, data_dir=str(tmp_path / "data"))
             for r in range(world)]
    models = [model for _, model, _ in built]
    for model in models:  # the same initial model, bit for bit
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert torch.equal(flat, reference.model.flatten())
    args = ddp_train.parse(["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
                            "--lr-schedule", schedule, "--steps", str(steps)])
    opts, schedules = zip(*(ddp_train.make_optimizer(args, m.parameters()) for m in models), strict=True)
    task = built[0][0]
    for _ in range(steps):
        for (_, model, data), opt in zip(built, opts, strict=True):
            x, y = data.next_batch()
            opt.zero_grad()
            task.loss_fn(model(x), y).backward()
        for params in zip(*(m.parameters() for m in models), strict=True):  # DDP's allreduce mean
            mean = torch.stack([p.grad for p in params]).mean(0)
            for p in params:
                p.grad.copy_(mean)
        for opt, scheduler in zip(opts, schedules, strict=True):
            opt.step()
            scheduler.step()
        reference.train_step()
    flat = torch.cat([p.detach().reshape(-1) for p in models[0].parameters()])
    assert torch.allclose(flat, reference.algorithm.eval_params(), rtol=0, atol=1e-6)
    # the rate after the last update: past the schedule's end, at min_ratio
    assert opts[0].param_groups[0]["lr"] == pytest.approx(0.05 * (1.0 if schedule == "constant" else 0.1))
    # the batches were the same: each rank's data position equals gradwire's worker's
    assert [d.state_dict() for _, _, d in built] == [reference.oracle.workers[r].state_dict() for r in range(world)]


def test_powersgd_floats_follow_torch_should_compress():
    ddp_train = load_script()
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 2), torch.nn.Linear(2, 1))
    # 32x64 compressed at rank 4: (32 + 64) * 4; 2x32 (r = 2: 34 * 2 * 2 >= 64) and 1x2 raw; biases raw: 32 + 2 + 1
    assert ddp_train.powersgd_floats(model, 4) == (32 + 64) * 4 + 64 + 2 + 35


def test_powersgd_step_bytes_halve_everything_in_the_fp16_wrapper():
    ddp_train = load_script()
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 2), torch.nn.Linear(2, 1))
    dense, compressed = sum(p.numel() for p in model.parameters()), (32 + 64) * 4 + 64 + 2 + 35
    full = ddp_train.powersgd_step_bytes(model, 4, 4, 2, False)
    half = ddp_train.powersgd_step_bytes(model, 4, 4, 2, True)
    # steps 1 and 2 plain (the hook's counter starts at 0), then compressed; ring: 2 (W - 1) per byte
    assert [full(s) for s in (1, 2, 3)] == [6 * 4 * dense, 6 * 4 * dense, 6 * 4 * compressed]
    assert [half(s) for s in (1, 2, 3)] == [6 * 2 * dense, 6 * 2 * dense, 6 * 2 * compressed]
