"""The synchronous variants run unchanged with one worker per process: the numbers match the
simulator's, first with one thread per rank (subgroups included), then on real gloo processes
started by torchrun through `gradwire launch`."""

import pytest
import torch

from gradwire.cli import main
from gradwire.run.loop import Run
from tests.backends.processes import ranks
from tests.backends.threads import run_one_worker_per_thread
from tests.helpers import LOCAL_UPDATES, read_jsonl

SYNC_SPECS = [
    "lsgd:pull=0.3,period=2,prox=0,window=2,eval=leader",  # LSGD as it ran before issue 17
    "lsgd:pull=0.3,period=2",  # the authors' protocol: proximal pull, window τ/4, the average evaluated
    "lsgd:groups=2,pull=0.5,period=2,global_pull=0.2,global_period=3,prox=0.5,global_prox=0.4,eval=each",
    "easgd:period=2",
    "easgd:period=2,eval=average",
    "local:period=3",
    "local:period=3,eval=average",
    "dasgd:period=3,delay=2",
]


@pytest.mark.parametrize("spec", SYNC_SPECS)
def test_one_thread_per_rank_matches_the_simulator(make_config, spec):
    cfg = make_config(LOCAL_UPDATES, algorithm=spec, nesterov=True)
    sim = Run(cfg)
    sim_infos = [sim.train_step() for _ in range(9)]
    sim.algorithm.before_evaluation(sim.ctx)
    threads = run_one_worker_per_thread(cfg, 9)
    for rank, got in threads.items():
        assert torch.equal(got["x"], sim.algorithm.replicas.x[rank]), f"rank {rank} differs"
        if rank == 0 or "eval=each" not in spec:  # every process holds what is evaluated (each: rank 0 gathers)
            assert torch.equal(got["eval"], sim.algorithm.eval_params())
        for mine, everyone in zip(got["infos"], sim_infos):
            for key in ("leader", "leader_loss", "in_flight", "merged_from_step"):
                assert mine.get(key) == everyone.get(key), key
            if "group_leaders" in everyone:  # a process reports the leader of its own group only
                assert mine["group_leaders"] == [everyone["group_leaders"][rank // 2]]


TORCH_COMMON = ["--task", "digits-logreg", "--steps", "8", "--eval-every", "2", "--batch-size", "16", "--lr", "0.1",
                "--momentum", "0.9", "--network", "ring:mbps=100,latency_ms=1", "--seed", "1"]


@pytest.mark.slow
@pytest.mark.timeout(400)
# ~17 s each on 2 cores, so two: LSGD's allgather + broadcast of the leader, and DaSGD's background
# allreduce (EASGD and local SGD use the blocking allreduce of sync SGD, which test_backend_equality.py covers)
# LSGD with the authors' defaults (proximal pull, window τ/4, the workers' average evaluated through
# an allreduce that is not charged) and Nesterov momentum; multi-leader with each worker evaluated
@pytest.mark.parametrize("nproc, spec", [(3, "lsgd:pull=0.3,period=2"), (2, "dasgd:period=3,delay=2"),
                                         (4, "lsgd:groups=2,pull=0.5,period=2,global_pull=0.2,global_period=3,"
                                             "prox=0.5,global_prox=0.4,eval=each")])
def test_torch_backend_matches_the_simulator(tmp_path, data_dir, nproc, spec):
    common = [*TORCH_COMMON, "--nesterov", "--weight-decay", "0.0001"]
    p = ranks(nproc, [*common, "--algorithm", spec], tmp_path / "torch", data_dir, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert main(["run", *common, "--algorithm", spec, "--workers", str(nproc), "--out", str(tmp_path / "sim"),
                 "--data-dir", str(data_dir)]) == 0
    real, sim = read_jsonl(tmp_path / "torch" / "metrics.jsonl"), read_jsonl(tmp_path / "sim" / "metrics.jsonl")
    assert [r["step"] for r in real] == [r["step"] for r in sim] == [0, 2, 4, 6, 8]
    torch.testing.assert_close([r["train_loss"] for r in real], [r["train_loss"] for r in sim], rtol=1e-5, atol=1e-6)
    assert [r["test_acc"] for r in real] == [r["test_acc"] for r in sim]
    assert [r.get("test_acc_each") for r in real] == [r.get("test_acc_each") for r in sim]
    assert [r.get("leader") for r in real] == [r.get("leader") for r in sim]
    # subgroup collectives included, the torch backend counts the bytes the simulator's ring network does
    assert [r["bytes_sent"] for r in real] == [r["bytes_sent"] for r in sim]
