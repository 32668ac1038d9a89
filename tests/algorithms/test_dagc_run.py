"""DAGC in runs: FedAvg weighting, local rounds, bytes equal to uniform top-k, resumable state."""

import json

import numpy as np
import pytest
import torch

from gradwire.cli import main
from gradwire.compress import CorruptPayload, Packet
from gradwire.compress.sparse import KeepTopK
from gradwire.run.loop import Run, run
from gradwire.tasks.oracle import WorkerData
from tests.helpers import ADAPTIVE, read_jsonl, resume_matches


def replay(r: Run) -> dict[int, WorkerData]:
    """Independent copies of every worker's data stream (same seed, same batches)."""
    return {k: WorkerData(w.x, w.y, batch_size=w.batch_size, seed=w.seed, rank=k) for k, w in r.oracle.workers.items()}


def grad(r: Run, x: torch.Tensor, batch) -> torch.Tensor:
    """The minibatch gradient at flat parameters x, computed apart from the run's own model code."""
    module = r.task.model_fn(torch.Generator().manual_seed(0))
    leaf = x.detach().clone().requires_grad_(True)
    views, offset = {}, 0
    for name, p in module.named_parameters():
        views[name] = leaf[offset: offset + p.numel()].view(p.shape)
        offset += p.numel()
    loss = r.task.loss_fn(torch.func.functional_call(module, views, (batch[0],)), batch[1])
    return torch.autograd.grad(loss, leaf)[0]


def test_lossless_budget_is_data_weighted_sgd(make_config):
    """budget=1 keeps everything: a step is x <- x - γ Σ p_i g_i (FedAvg weights n_i/n, not 1/N)."""
    r = Run(make_config(ADAPTIVE, algorithm="dagc:budget=1", momentum=0.0))
    data, shares = replay(r), np.array(r.shard_sizes) / sum(r.shard_sizes)
    x = r.algorithm.eval_params().clone()
    for _ in range(3):
        r.train_step()
        g = sum(float(shares[k]) * grad(r, x, data[k].next_batch()) for k in data)
        x = x - 0.1 * g
    torch.testing.assert_close(r.algorithm.eval_params(), x, rtol=1e-5, atol=1e-6)
    assert len(set(r.shard_sizes)) > 1  # the weighting matters here


def paper_counts(shares: np.ndarray, budget_percent: int, d: int) -> list[int]:
    """DAGC-R's allocation, written from the rule (not the module's code): K = N·ceil(r·d) elements in
    all, k_i ∝ p_i^(2/3), rounded by largest remainder (ties by rank). No worker is capped here."""
    total = len(shares) * -(-budget_percent * d // 100)
    weights = shares ** (2 / 3)
    ideal = total * weights / weights.sum()
    assert (ideal >= 1).all() and (ideal <= d).all()  # no clipping at [1, d] for this case
    counts = np.floor(ideal).astype(int)
    for r in sorted(range(len(shares)), key=lambda r: (-(ideal[r] - counts[r]), r))[: total - counts.sum()]:
        counts[r] += 1
    assert counts.sum() == total
    return [int(k) for k in counts]


def test_each_worker_sends_its_own_top_k_and_the_step_is_the_weighted_sum(make_config):
    """budget<1, no error feedback, no momentum: worker i's payload holds exactly k_i elements, its
    k_i largest-magnitude gradient entries (k_i from the allocation rule, computed here), and the step
    is x <- x - γ Σ_i p_i top_{k_i}(g_i). Read from what each worker puts on the wire."""
    r = Run(make_config(ADAPTIVE, algorithm="dagc:budget=0.05", momentum=0.0))
    data, shares = replay(r), np.array(r.shard_sizes) / sum(r.shard_sizes)
    x = r.algorithm.eval_params().clone()
    d = x.numel()
    keep = paper_counts(shares, 5, d)
    assert len(set(keep)) == len(keep)  # every worker a different count: a swapped allocation shows
    sent = []
    allgather = r.ctx.transport.allgather

    def recording(buffers, *args, **kwargs):
        out = allgather(buffers, *args, **kwargs)
        sent.append({k: b.clone() for k, b in out.items()})
        return out

    r.ctx.transport.allgather = recording
    for _ in range(2):
        r.train_step()
        payloads = sent.pop()
        assert sorted(payloads) == list(range(len(keep))) and not sent
        step = torch.zeros_like(x)
        for k in sorted(data):
            g = grad(r, x, data[k].next_batch())
            top = torch.topk(g.abs(), keep[k]).indices
            mine = torch.zeros_like(g)
            mine[top] = g[top]
            try:  # a payload holding another count of elements does not decode as k_i of them
                message = KeepTopK(k=keep[k]).decode(Packet(payloads[k], x.shape, x.dtype))
            except CorruptPayload as e:
                pytest.fail(f"worker {k} did not send k={keep[k]} elements (allocation {keep}): {e}")
            assert int((message != 0).sum()) == keep[k], (k, keep)
            torch.testing.assert_close(message, mine, rtol=1e-5, atol=1e-7)
            step += float(shares[k]) * mine
        x = x - 0.1 * step
        torch.testing.assert_close(r.algorithm.eval_params(), x, rtol=1e-5, atol=1e-6)


def test_local_steps_is_fedavg(make_config):
    """local_steps=K, lossless, no momentum: the new model is Σ p_i x_i after K local SGD steps."""
    r = Run(make_config(ADAPTIVE, algorithm="dagc:budget=1,local_steps=3", momentum=0.0))
    data, shares = replay(r), np.array(r.shard_sizes) / sum(r.shard_sizes)
    x = r.algorithm.eval_params().clone()
    for _ in range(2):
        info = r.train_step()
        local = {}
        for k in data:
            local[k] = x.clone()
            for _ in range(3):
                local[k] = local[k] - 0.1 * grad(r, local[k], data[k].next_batch())
        x = sum(float(shares[k]) * local[k] for k in data)
    torch.testing.assert_close(r.algorithm.eval_params(), x, rtol=1e-5, atol=1e-5)
    assert info["gradients"] == 4 * 3


def test_relative_mode_sends_the_bytes_of_uniform_topk(make_config, tmp_path):
    """Same total kept elements as topk:ratio=r on every worker, so the same value bytes. Gap-coded
    positions cost fewer bits per element where more are kept (log2 C(d, k) is concave in k), so
    the uneven allocation sends no more than uniform top-k (up to a byte of padding per message),
    and not much less."""
    common = dict(steps=5, error_feedback=True)
    dagc = run(make_config(ADAPTIVE, out="a/run", algorithm="dagc:budget=0.02", **common))
    topk = run(make_config(ADAPTIVE, out="b/run", algorithm="sync", compressor="topk:ratio=0.02", **common))
    n, steps = 4, 5
    assert dagc["bytes_sent"] <= topk["bytes_sent"] + steps * n * n  # ps allgather: N copies
    assert dagc["bytes_sent"] >= 0.98 * topk["bytes_sent"]
    info = json.loads((tmp_path / "a" / "run" / "algorithm.json").read_text())
    assert sum(info["keep"]) == info["total_keep"] == n * int(np.ceil(0.02 * info["parameters"]))
    assert info["ratios"] == sorted(info["ratios"])  # volumes:skew grows with the rank
    steps_log = read_jsonl(tmp_path / "a" / "run" / "steps.jsonl")
    assert all(s["kept"] == info["total_keep"] for s in steps_log)


def test_absolute_mode_thresholds_follow_the_power_law(make_config):
    r = Run(make_config(ADAPTIVE, algorithm="dagc:budget=0.05,mode=absolute", error_feedback=True))
    info = r.algorithm.setup_info()
    shares, tau = np.array(info["shares"]), np.array(info["thresholds"])
    np.testing.assert_allclose(tau * shares ** (2 / 3), (tau * shares ** (2 / 3))[0], rtol=1e-4)
    first = r.train_step()
    # calibrated at the initial parameters: the first step keeps about the budget
    assert 0.3 * 0.05 < first["kept_fraction"] < 3 * 0.05
    given = Run(make_config(ADAPTIVE, algorithm="dagc:budget=0.05,mode=absolute,tau=0.01"))
    np.testing.assert_allclose(given.algorithm.setup_info()["thresholds"],
                               0.01 * (4 * np.array(info["shares"])) ** (-2 / 3), rtol=1e-4)


@pytest.mark.parametrize("algorithm, ef", [("dagc:budget=0.05", True), ("dagc:budget=0.05,mode=absolute", True),
                                           ("dagc:budget=0.1,local_steps=3", True), ("dagc:budget=0.05", False)])
def test_state_round_trip_mid_run(make_config, algorithm, ef):
    resume_matches(make_config(ADAPTIVE, algorithm=algorithm, error_feedback=ef), first=4, then=4)


def test_cli_shows_the_ratios(tmp_path, data_dir, capsys):
    code = main(["run", "--task", "digits-mlp", "--workers", "4", "--partition", "volumes:skew=8",
                 "--algorithm", "dagc:budget=0.02", "--error-feedback", "--steps", "2", "--eval-every", "2",
                 "--out", str(tmp_path / "o"), "--data-dir", str(data_dir)])
    out = capsys.readouterr().out
    assert code == 0
    assert "dagc:budget=0.02 set-up:" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("worker"))
    assert header.split() == ["worker", "shares", "ratios", "keep"]
    info = json.loads((tmp_path / "o" / "algorithm.json").read_text())
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
    assert [int(r[3]) for r in rows] == info["keep"]  # the table shows each worker's assigned count
