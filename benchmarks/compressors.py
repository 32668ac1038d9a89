"""Throughput, wire size and memory of every compressor, beside a clone() of the same tensor.

    python benchmarks/compressors.py            # 1M and 25M float32 elements, one thread
    python benchmarks/compressors.py --quick    # 1M only
    python benchmarks/compressors.py --threads 2 --spec qsgd --spec sign

Timing: best of ``--repeats`` runs of encode and of decode on a fixed ``randn`` tensor. Each row
also times ``x.clone()`` right before its compressor; ``ratio`` is (encode + decode) divided by
the fastest of those clones at that size (the conservative choice). Throughput is input bytes
(4 per element) per second.

Memory: a fresh subprocess per row allocates the input, warms the compressor up on a small tensor,
then resets the kernel's peak-RSS mark (``/proc/self/clear_refs``) and encodes and decodes once;
``peak MiB`` is the peak resident set size (``VmHWM``) minus the resident size before (``VmRSS``):
the packet, the decoded output and every temporary, as the kernel saw them (torch's allocations
are invisible to tracemalloc). The clone row is the baseline: one tensor of the input's size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gradwire.compress import build  # noqa: E402

SPECS = [
    "none", "fp16", "bf16", "sign", "sign:scaled=true", "terngrad", "terngrad:clip=0", "qsgd",
    "qsgd:levels=1", "qsgd:levels=127", "pquant", "pquant:p=1", "pquant:p=2", "natural",
    "topk:ratio=0.01", "randk:ratio=0.01", "threshold:tau=2.576",
]


def best(fn, repeats: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def peak_growth_mb(spec: str, n: int, threads: int) -> float:
    """Run the memory probe in a fresh interpreter, so no earlier peak hides this one."""
    cmd = [sys.executable, __file__, "--probe", spec, "--size", str(n), "--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def probe(spec: str, n: int) -> None:
    x = torch.randn(n)
    c = None if spec == "clone" else build(spec)
    if c is not None:  # warm up on a small tensor: one-time tables are not part of the peak
        c.decode(c.encode(torch.randn(1000), generator=torch.Generator().manual_seed(0)))
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS (Linux >= 4.0)
    before = _status_kib("VmRSS")
    if c is None:
        y = x.clone()
    else:
        packet = c.encode(x, generator=torch.Generator().manual_seed(0))
        y = c.decode(packet)
    del y
    print((_status_kib("VmHWM") - before) / 1024)


def row(spec: str, x: torch.Tensor, repeats: int, memory: bool, threads: int) -> dict:
    c = build(spec)
    g = torch.Generator().manual_seed(0)
    c.decode(c.encode(x[:1000], generator=g))  # warm-up
    clone_s, _ = best(x.clone, repeats)
    enc_s, packet = best(lambda: c.encode(x, generator=g), repeats)
    dec_s, _ = best(lambda: c.decode(packet), repeats)
    peak = peak_growth_mb(spec, x.numel(), threads) if memory else None
    return {"spec": c.spec(), "n": x.numel(), "bits": 8 * packet.nbytes / x.numel(), "enc": enc_s,
            "dec": dec_s, "clone": clone_s, "peak": peak}


def table(rows: list[dict]) -> str:
    lines = [
        "| compressor | elements | bits/element | encode ms | decode ms | encode GB/s | decode GB/s "
        "| (enc+dec)/clone | peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    clone = {}
    for r in rows:
        clone[r["n"]] = min(clone.get(r["n"], float("inf")), r["clone"])

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        gb, enc, dec = 4 * r["n"] / 1e9, r["enc"], r["dec"]
        ratio = (enc + dec) / clone[r["n"]] if enc is not None else r["clone"] / clone[r["n"]]
        ms = [num(t and 1e3 * t, ".1f") for t in (enc, dec)]
        rate = [num(t and gb / t, ".2f") for t in (enc, dec)]
        lines.append(
            f"| `{r['spec']}` | {r['n'] / 1e6:g}M | {r['bits']:.3f} | {ms[0]} | {ms[1]} | {rate[0]} "
            f"| {rate[1]} | {ratio:.2f} | {num(r['peak'], '.0f')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M elements only")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (best is kept)")
    ap.add_argument("--spec", action="append", help="compressor spec to run (repeatable; default: all)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.probe:
        probe(args.probe, args.size)
        return
    sizes = [1_000_000] if args.quick else [1_000_000, 25_000_000]
    print(f"torch {torch.__version__}, {args.threads} thread(s), best of {args.repeats}; randn float32\n")
    rows = []
    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(0))
        for spec in args.spec or SPECS:
            rows.append(row(spec, x, args.repeats, not args.no_memory, args.threads))
            r = rows[-1]
            print(f"  {r['spec']:<28} {n:>9}  (enc+dec)/clone {(r['enc'] + r['dec']) / r['clone']:.2f}",
                  file=sys.stderr)
        clone_s, _ = best(x.clone, args.repeats)
        peak = None if args.no_memory else peak_growth_mb("clone", n, args.threads)
        rows.append({"spec": f"x.clone(): {1e3 * clone_s:.1f} ms", "n": n, "bits": 32.0, "enc": None,
                     "dec": None, "clone": clone_s, "peak": peak})
    print(table(rows))


if __name__ == "__main__":
    main()
