"""Encode + decode time of every codec against a device-to-device copy of the same tensor.

    python benchmarks/gpu_codecs.py                 # CUDA: 64M float32 elements, CUDA events
    python benchmarks/gpu_codecs.py --device cpu    # CPU, one thread: 4M elements, perf_counter
    python benchmarks/gpu_codecs.py --size 16M --spec qsgd --spec topk:ratio=0.01 --dtype bfloat16
    python benchmarks/gpu_codecs.py --small         # does it still run? (tests/ddp/test_gpu_benchmarks_run.py)

Per codec and kernel set (``torch``: the reference; ``triton``: gradwire.kernels, on CUDA, or on
the CPU under ``TRITON_INTERPRET=1``, where the time means nothing), after ``--warmup`` untimed
rounds, ``--repeats`` rounds are timed one by one (CUDA events around each on a GPU, so no host
timer sees launch latency; ``perf_counter`` on the CPU) and the median is kept. Every row times a
``clone()`` of the input just before its codec, in the same way: ``x copy`` is the codec's median
over the clone's. The floor for a codec is about one copy (read the gradient once, write the
payload, read it, write the output). ``GB/s`` is the input's bytes over the encode + decode time,
``bits/el`` the payload size, ``peak MiB`` the most device memory the round allocated beyond the
input (CUDA only: ``torch.cuda.max_memory_allocated``). ``torch.topk`` of the magnitudes at the
same k is timed as the reference a top-k codec should beat. ``target`` is issue 35's goal on a GPU
and whether the row meets it (CUDA only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gradwire import kernels  # noqa: E402
from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402
from gradwire.compress import build  # noqa: E402

SPECS = ["fp16", "bf16", "sign", "sign:scaled=true", "qsgd", "qsgd:levels=1", "qsgd:levels=4", "terngrad", "pquant",
         "natural", "topk:ratio=0.01", "randk:ratio=0.01", "threshold:tau=2.576"]
TARGETS = {"fp16": 1.3, "bf16": 1.3, "sign": 1.3, "qsgd": 2.0, "terngrad": 2.0, "pquant": 2.0, "natural": 2.0,
           "topk": 5.0}  # x copy, encode + decode, on an H100 (issue 35)
FUSED = ("sign", "qsgd", "terngrad", "pquant", "natural")  # the codecs gradwire.kernels has kernels for


def size_arg(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


class Timer:
    """Median seconds of ``fn`` over repeats, after warm-up, timed with CUDA events on a GPU."""

    def __init__(self, device: torch.device, warmup: int, repeats: int):
        self.device, self.warmup, self.repeats = device, warmup, repeats

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.repeats):
            if self.device.type == "cuda":
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop) / 1e3)
            else:
                start_s = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start_s)
        return statistics.median(times)


def round_trip(spec: str, x: torch.Tensor, generator: torch.Generator, kernel_set: str):
    codec = build(spec)

    def fn():
        kernels.use(kernel_set)
        try:
            packet = codec.encode(x, generator=generator)
            codec.decode(packet)
        finally:
            kernels.use(None)
        return packet

    return fn


def kernel_sets(device: torch.device, asked: str | None) -> list[str]:
    """torch always; triton where it can run (CUDA, or the CPU under the interpreter)."""
    if asked:
        return asked.split(",")
    can = kernels.available() and (device.type == "cuda" or kernels.interpreting())
    return ["torch", "triton"] if can else ["torch"]


def target(spec: str, ratio: float, topk_ratio: float | None, device: torch.device) -> str:
    goal = TARGETS.get(spec.split(":")[0])
    if goal is None or device.type != "cuda":
        return "-"
    ok = ratio <= goal and (topk_ratio is None or ratio < topk_ratio)
    return f"<={goal:g}{' and < topk' if topk_ratio is not None else ''}: {'met' if ok else 'MISSED'}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_flags(p, only=("device",), defaults={"device": "cuda" if torch.cuda.is_available() else "cpu"})
    p.add_argument("--size", type=size_arg, default=None, help="elements (default 64M on cuda, 4M on cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--spec", action="append", help="codec spec (repeatable; default: every codec)")
    p.add_argument("--kernels", default=None, help="torch,triton (default: triton too where it can run)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 50 on cuda, 7 on cpu)")
    p.add_argument("--small", action="store_true", help="4K elements, 1 warm-up, 2 repeats: checks it runs")
    args, _ = parse_run_args(p, argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_codecs: --device cuda, but torch sees no CUDA device here; use --device cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
    if args.small:
        args.size, args.warmup, args.repeats = args.size or 4096, 1, 2
    n = args.size or (64 << 20 if device.type == "cuda" else 4 << 20)
    timer = Timer(device, args.warmup, args.repeats or (50 if device.type == "cuda" else 7))
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(device, getattr(torch, args.dtype))
    generator = torch.Generator(device=device).manual_seed(1)
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread"
    interp = " (Triton interpreter: triton times mean nothing)" if kernels.interpreting() else ""
    print(f"# {n:,} {args.dtype} elements on {device} ({what}){interp}; torch {torch.__version__}; "
          f"median of {timer.repeats}; load average {os.getloadavg()[0]:.1f}")
    print("| codec | kernels | ms | copy ms | x copy | GB/s | bits/el | peak MiB | target |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for spec in args.spec or SPECS:
        topk_ratio = None
        if spec.startswith("topk"):
            k = build(spec).count(n)
            clone_s = timer(x.clone)
            topk_s = timer(lambda k=k: torch.topk(x.abs(), k, sorted=False))
            topk_ratio = topk_s / clone_s
            print(f"| torch.topk(\\|x\\|, k) | torch | {topk_s * 1e3:.3f} | {clone_s * 1e3:.3f} | {topk_ratio:.2f} "
                  f"| {x.nbytes / topk_s / 1e9:.2f} | | | |")
        for kernel_set in kernel_sets(device, args.kernels):
            if kernel_set == "triton" and spec.split(":")[0] not in FUSED:
                continue
            clone_s = timer(x.clone)
            fn = round_trip(spec, x, generator, kernel_set)
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            seconds = timer(fn)
            peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else float("nan")
            bits = 8 * fn().nbytes / n
            ratio = seconds / clone_s
            goal = target(spec, ratio, topk_ratio, device)
            print(f"| {spec} | {kernel_set} | {seconds * 1e3:.3f} | {clone_s * 1e3:.3f} | {ratio:.2f} "
                  f"| {x.nbytes / seconds / 1e9:.2f} | {bits:.3f} | {peak:.1f} | {goal} |")


if __name__ == "__main__":
    main()
