"""Encode + decode time of every codec against a device-to-device clone of the same tensor.

    python benchmarks/gpu_codecs.py                 # CUDA: 64M float32 elements, CUDA events
    python benchmarks/gpu_codecs.py --device cpu    # CPU, one thread: 4M elements, perf_counter
    python benchmarks/gpu_codecs.py --size 16M --spec qsgd --spec topk:ratio=0.01

Per codec, after ``--warmup`` untimed rounds, ``--repeats`` rounds are timed one by one (CUDA
events around each on a GPU, so no host timer sees launch latency; ``perf_counter`` on the CPU)
and the median is kept. Every row times a ``clone()`` of the input just before its codec, in the
same way, and ``x clone`` is the codec's median over the clone's: the floor for a codec is about
one clone (read the gradient once, write the payload and the output). ``bits/el`` is the payload
size, and ``peak MiB`` the most device memory the round allocated beyond the input (CUDA only:
``torch.cuda.max_memory_allocated``). ``torch.topk`` of the magnitudes at the same k is timed as
the reference a top-k codec should beat.

Targets (issue 12, on a GPU): at most 2x a clone for sign, qsgd, terngrad, pquant, natural and
fp16; top-k at 1% at most 5x a clone and faster than ``torch.topk``. On the CPU: 0.25x the
throughput of a clone, i.e. at most 4x a clone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gradwire.compress import build  # noqa: E402

SPECS = ["fp16", "bf16", "sign", "sign:scaled=true", "qsgd", "qsgd:levels=1", "terngrad", "pquant", "natural",
         "topk:ratio=0.01", "randk:ratio=0.01", "threshold:tau=2.576"]


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


def round_trip(spec: str, x: torch.Tensor, generator: torch.Generator):
    codec = build(spec)

    def fn():
        packet = codec.encode(x, generator=generator)
        codec.decode(packet)
        return packet

    return fn


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--size", type=size_arg, default=None, help="elements (default 64M on cuda, 4M on cpu)")
    p.add_argument("--spec", action="append", help="codec spec (repeatable; default: every codec)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 50 on cuda, 7 on cpu)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_codecs: --device cuda, but torch sees no CUDA device here; use --device cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
    n = args.size or (64 << 20 if device.type == "cuda" else 4 << 20)
    timer = Timer(device, args.warmup, args.repeats or (50 if device.type == "cuda" else 7))
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(device)
    generator = torch.Generator(device=device).manual_seed(1)
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread"
    print(f"# {n:,} float32 elements on {device} ({what}); torch {torch.__version__}; median of {timer.repeats}")
    print(f"{'codec':<22} {'ms':>9} {'clone ms':>9} {'x clone':>8} {'bits/el':>8} {'peak MiB':>9}")
    for spec in args.spec or SPECS:
        clone_s = timer(x.clone)
        fn = round_trip(spec, x, generator)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        seconds = timer(fn)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else float("nan")
        bits = 8 * fn().nbytes / n
        print(f"{spec:<22} {seconds * 1e3:9.3f} {clone_s * 1e3:9.3f} {seconds / clone_s:8.2f} {bits:8.3f} {peak:9.1f}")
        if spec.startswith("topk"):
            k = build(spec).count(n)
            topk_s = timer(lambda k=k: torch.topk(x.abs(), k, sorted=False))
            print(f"{'  torch.topk(|x|, k)':<22} {topk_s * 1e3:9.3f} {clone_s * 1e3:9.3f} {topk_s / clone_s:8.2f}")


if __name__ == "__main__":
    main()
