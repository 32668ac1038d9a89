"""Tensor parallelism in 1-D, 2-D and 2.5-D: measured on the namespace test bed, predicted with
gradwire's network model (docs/tensor_parallel.md has the figures and the commands).

``testbed`` (needs root): 8 processes, one per namespace (scripts/testbed.py, a rate-limited
full-duplex link each), training ``stdlib-lm`` with ``--tensor-parallel`` 1d:p=8, 2d:q=2 (x 2
data-parallel workers, the 8 processes a 2-D layout can fill) and 2.5d:q=2,d=2, on the same
global batch of sequences; per layout the wall seconds per step (after the first, which includes
gloo's connection set-up) and the bytes per step (tensor-parallel ``tp_bytes`` + data-parallel
``dp_bytes``, from steps.jsonl), beside the bytes that ``gradwire.parallel.cost`` predicts, and
what the namespaces' veth interfaces really sent over the whole run (start-up, evaluations and
TCP/IP headers included).

``predict``: the time of one transformer block's communication per training step on the ring
network model (``transports/network.py``: every process has its own full-duplex link; broadcast
and reduce over g ranks cost (g-1)·latency + n/bandwidth, pipelined; all-reduce
2·(g-1)·(latency + n/(g·bandwidth))), plus its matmuls at a given rate, for 2-D [q,q,1] and
2.5-D [q,q,d] under weak scaling (tokens per process fixed), out to [8,8,1] against [4,4,4] at
P = 64, beside the 1.45x of Wang et al. 2021 (SUMMA2.5-LM).

    sudo .venv/bin/python benchmarks/tensor_parallel.py testbed [--mbps 200] [--steps 6]
    python benchmarks/tensor_parallel.py predict [--hidden 2048] [--tokens-per-process 4096] [--gbps 25]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402
from gradwire.parallel import cost  # noqa: E402
from gradwire.parallel.layout import parse_layout  # noqa: E402
from gradwire.transports.network import RingNetwork  # noqa: E402

LAYOUTS = ["1d:p=8", "2d:q=2", "2.5d:q=2,d=2"]
TASK = dict(context=32, dim=128, layers=2, heads=8)  # heads split 8 ways by 1d:p=8


def testbed(a) -> list[dict]:
    task = "stdlib-lm:" + ",".join(f"{k}={v}" for k, v in TASK.items()) + ",train_bytes=200000,val_bytes=2000"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    rows = []
    for layout in LAYOUTS:
        out = Path(a.out) / layout.replace(":", "-").replace(",", "-")
        lay = parse_layout(layout)
        dp = 8 // lay.size
        cmd = [sys.executable, str(ROOT / "scripts" / "testbed.py"), "--nodes", "8", "--mbps", f"{a.mbps:g}",
               "--timeout-s", "600", "--", "run", "--task", task, "--tensor-parallel", layout, "--steps",
               str(a.steps), "--eval-every", str(a.steps), "--batch-size", str(a.batch // dp), "--lr", "0.01",
               "--out", str(out), "--overwrite", "--timeout-s", "300"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
        if p.returncode:
            raise SystemExit(f"{layout}: the test bed failed ({p.returncode}):\n{p.stderr[-3000:]}")
        steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
        predicted = dp * sum(cost.lm_step_bytes(lay, batch=a.batch // dp, vocab=256, e=4, **{
            k: TASK[k] for k in ("context", "dim", "layers")}).values())
        later = steps[1:]
        rows.append({"layout": layout, "dp": dp, "s_per_step": (later[-1]["sim_time_s"] - steps[0]["sim_time_s"])
                     / len(later), "tp_mb": later[-1]["tp_bytes"] / 1e6, "dp_mb": later[-1]["dp_bytes"] / 1e6,
                     "tp_mb_predicted": predicted / 1e6, "final_loss": steps[-1]["loss"],
                     "model_comm_s": lm_comm_time(layout, batch=a.batch // dp, vocab=256,
                                                  net=RingNetwork(mbps=a.mbps, latency_ms=0.05), **{
                                                      k: TASK[k] for k in ("context", "dim", "layers")}),
                     "veth_mb": sum(x["tx_bytes"] for x in json.loads((out / "testbed" / "testbed.json").read_text())
                                    ["links"]) / 1e6})
    print(f"8 processes, {a.mbps:g} Mbit/s each way per process, stdlib-lm {TASK}, {a.batch} sequences per step "
          f"in all, float32, {a.steps} steps\n")
    print("| layout | dp | s / step | network model: tp comm s / step | tp MB / step (predicted) | dp MB / step "
          "| veth MB, whole run | loss at the end |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['dp']} | {r['s_per_step']:.2f} | {r['model_comm_s']:.2f} | {r['tp_mb']:.2f} "
              f"({r['tp_mb_predicted']:.2f}) | {r['dp_mb']:.2f} | {r['veth_mb']:.1f} | {r['final_loss']:.3f} |")
    return rows


def held_time(nbytes: int, sizes: list[int], net: RingNetwork, *, partial: bool) -> float:
    """Seconds of one process assembling a tensor it uses whole and holds split over nested groups of
    ``sizes`` (innermost first; parallel/comm.py's Partitioned), ``nbytes`` the whole tensor (this
    process's block of it): forward, at each level one broadcast per member of its piece of that level's
    part; backward, with ``partial`` gradients (SUMMA), the same reduces outermost first (priced as
    broadcasts: the same bytes and steps); without (1-D), nothing."""
    seconds, part, parts = 0.0, nbytes, []
    for g in reversed(sizes):  # the part each level assembles, outermost (the whole) first
        parts.append((g, part))
        part //= g
    for g, whole in reversed(parts):  # forward, innermost first
        seconds += g * net.broadcast(whole // g, g).time_s
    return seconds * (2 if partial else 1)


def block_time(q: int, d: int, *, tokens: int, hidden: int, net: RingNetwork, flops: float, e: int = 2) -> dict:
    """One transformer block (qkv h->3h, out h->h, fc1 h->4h, fc2 4h->h), forward and backward, on
    a [q,q,d] mesh: the seconds of its collectives in order (each SUMMA step: 6 collectives of
    an X or W block along a row or column of q ranks; each weight block held split over the depth,
    assembled forward and its gradient reduced to the pieces backward) and of its matmuls at
    ``flops`` per process; bytes per process (cost.summa_linear)."""
    p = q * q * d
    comm = 0.0
    nbytes = 0
    for fan_in, fan_out in ((hidden, 3 * hidden), (hidden, hidden), (hidden, 4 * hidden), (4 * hidden, hidden)):
        x_block = tokens // (d * q) * fan_in // q * e
        w_block = fan_in * fan_out // (q * q) * e
        comm += q * 3 * (net.broadcast(x_block, q).time_s + net.broadcast(w_block, q).time_s)
        comm += held_time(w_block, [d], net, partial=True) if d > 1 else 0.0
        nbytes += cost.summa_linear(q, d, tokens, fan_in, fan_out, e, bias=False)
    compute = 6 * tokens * 12 * hidden * hidden / p / flops
    return {"comm_s": comm, "compute_s": compute, "total_s": comm + compute, "bytes_per_process": nbytes / p}


def lm_comm_time(layout: str, *, batch: int, context: int, dim: int, layers: int, vocab: int, net: RingNetwork,
                 e: int = 4) -> float:
    """Seconds of one process's tensor-parallel collectives in one training step of the test bed's
    model, on ``net``, one after another as the code issues them (the collectives of
    :mod:`gradwire.parallel.cost`, priced instead of counted), the tensors used whole by several ranks
    held once (:func:`held_time`)."""
    lay = parse_layout(layout)
    t = batch * context
    if lay.kind == "1d":
        p = lay.p

        def held(n: int) -> float:  # a tensor of n elements every rank uses whole
            return held_time(n * e, [p], net, partial=False)

        per_layer = (4 * net.allreduce(t * dim * e, p).time_s  # column inputs' gradients, row outputs
                     + 4 * held(dim) + 2 * held(dim))          # two norms' weight and bias; row-parallel biases
        return (held(vocab * dim) + held(context * dim) + layers * per_layer + 2 * held(dim)
                + held(vocab * dim) + held(vocab))  # embeddings, blocks, final norm, read-out weight and bias
    q, d = lay.q, lay.d
    p = q * q * d
    local = t // (d * q)  # tokens of one process

    def shared(n: int) -> float:  # a block of n elements used whole over the column and the depth
        return held_time(n * e, [q, d], net, partial=True)

    def linear(fan_in: int, fan_out: int) -> float:
        x_block, w_block = local * fan_in // q * e, fan_in * fan_out // (q * q) * e
        return (q * 3 * (net.broadcast(x_block, q).time_s + net.broadcast(w_block, q).time_s)
                + (held_time(w_block, [d], net, partial=True) if d > 1 else 0.0) + shared(fan_out // q))

    norm = 4 * net.allreduce(local * e, q).time_s + 2 * shared(dim // q)
    block = 2 * norm + linear(dim, 3 * dim) + linear(dim, dim) + linear(dim, 4 * dim) + linear(4 * dim, dim)
    return (shared(vocab * dim // q) + shared(context * dim // q) + layers * block + norm
            + linear(dim, vocab) + 3 * net.allreduce(local * e, q).time_s + net.allreduce(e, p).time_s)


def predict(a) -> list[dict]:
    net = RingNetwork(mbps=a.gbps * 1000, latency_ms=a.latency_us / 1000)
    series = [(2, 1), (2, 2), (4, 1), (2, 4), (4, 2), (8, 1), (4, 4)]  # [q,q,d]: P = 4 ... 64
    rows = []
    for q, d in series:
        p = q * q * d
        t = block_time(q, d, tokens=a.tokens_per_process * p, hidden=a.hidden, net=net, flops=a.tflops * 1e12)
        rows.append({"mesh": f"[{q},{q},{d}]", "P": p} | t)
    print(f"one transformer block, hidden {a.hidden}, {a.tokens_per_process} tokens per process (weak scaling), "
          f"fp16 (2 bytes), ring network {a.gbps:g} Gbit/s and {a.latency_us:g} us per process, "
          f"{a.tflops:g} TFLOP/s per process\n")
    print("| mesh | P | MB sent per process | comm s | matmul s | step s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mesh']} | {r['P']} | {r['bytes_per_process'] / 1e6:.1f} | {r['comm_s']:.4f} | "
              f"{r['compute_s']:.4f} | {r['total_s']:.4f} |")
    two, half = rows[-2], rows[-1]
    print(f"\nP = 64: [8,8,1] / [4,4,4] step time {two['total_s'] / half['total_s']:.2f}x, communication "
          f"{two['comm_s'] / half['comm_s']:.2f}x, bytes {two['bytes_per_process'] / half['bytes_per_process']:.2f}x "
          "(Wang et al. 2021 report 1.45x weak-scaling efficiency)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("testbed")
    t.add_argument("--mbps", type=float, default=200.0)
    add_run_flags(t, only=("steps", "out"), defaults={"steps": 6, "out": "runs/tensor-parallel"})
    t.add_argument("--batch", type=int, default=16, help="sequences per step in all (split over dp workers)")
    p = sub.add_parser("predict")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--tokens-per-process", type=int, default=4096)
    p.add_argument("--gbps", type=float, default=25.0)
    p.add_argument("--latency-us", type=float, default=10.0)
    p.add_argument("--tflops", type=float, default=50.0)
    a, _ = parse_run_args(ap)
    testbed(a) if a.what == "testbed" else predict(a)


if __name__ == "__main__":
    main()
