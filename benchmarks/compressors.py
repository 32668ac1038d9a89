"""Throughput, wire size and memory of every compressor, beside a clone() of the same tensor.

    python benchmarks/compressors.py            # 1M and 25M float32 elements, one thread
    python benchmarks/compressors.py --quick    # 1M only
    python benchmarks/compressors.py --threads 2 --spec qsgd --spec sign
    python benchmarks/compressors.py --positions  # top-k positions: bits against the limit, speed

Timing: best of ``--repeats`` runs of encode and of decode on a fixed ``randn`` tensor. Each row
also times ``x.clone()`` right before its compressor; ``ratio`` is (encode + decode) divided by
the fastest of those clones at that size (the conservative choice). Throughput is input bytes
(4 per element) per second.

Positions (``--positions``): top-k at ratio 1% and 0.1% of 4M randn elements (``--size`` to change),
in the Golomb-coded format (``compress/gapcode.py``) and in the fixed-width index list / bitmap
format it replaced, timed side by side in one run: bits per element against the information limit
(32 bits per kept value + log2 C(n, k) for the set of positions), encode and decode of the whole
compressor, and of the position section alone.

Memory: a fresh subprocess per row allocates the input, warms the compressor up on a small tensor,
then resets the kernel's peak-RSS mark (``/proc/self/clear_refs``) and encodes and decodes once;
``peak MiB`` is the peak resident set size (``VmHWM``) minus the resident size before (``VmRSS``):
the packet, the decoded output and every temporary, as the kernel saw them (torch's allocations
are invisible to tracemalloc). The clone row is the baseline: one tensor of the input's size.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gradwire.cli.flags import add_run_flags, parse_run_args  # noqa: E402
from gradwire.compress import bitpack, build, gapcode  # noqa: E402
from gradwire.compress.positions import check_finite, scatter  # noqa: E402
from gradwire.compress.sparse import TopK, top_indices  # noqa: E402
from gradwire.compress.wire import flat, make_packet, read  # noqa: E402

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
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
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


def index_list_encode(n: int, index: torch.Tensor) -> torch.Tensor:
    """The position section before the gap code: k fields of ceil(log2 n) bits, or an n-bit bitmap
    when that is no larger (chosen from n and k)."""
    width = (n - 1).bit_length()
    if -(-n // 8) <= -(-index.numel() * width // 8):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[index] = True
        return bitpack.pack(mask.view(torch.uint8), 1)
    return bitpack.pack_uint(index, width)


def index_list_decode(buf: torch.Tensor, n: int, k: int) -> torch.Tensor:
    width = (n - 1).bit_length()
    if -(-n // 8) <= -(-k * width // 8):
        return bitpack.unpack(buf, n, 1).view(torch.bool)
    return bitpack.unpack_uint(buf, k, width)


class IndexListTopK(TopK):
    """topk with the position format it had before the gap code (the benchmark's baseline)."""

    def encode(self, x, *, generator=None):
        xf = flat(x)
        check_finite(xf, self.name)
        index = top_indices(xf, self.count(xf.numel()))
        return make_packet(torch.cat([xf[index].view(torch.uint8), index_list_encode(xf.numel(), index)]), x)

    def decode(self, packet):
        n, k = packet.numel, self.count(packet.numel)
        size = 4 * k
        index = index_list_decode(packet.buffer[size:], n, k)
        return scatter(n, index, read(packet.buffer[:size], packet.dtype), packet.dtype, "topk")


def interleaved(fns: dict, repeats: int) -> dict:
    """Best time and last result of each function, run in turns (so drift hits all alike)."""
    times, out = {key: float("inf") for key in fns}, {}
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            out[key] = fn()
            times[key] = min(times[key], time.perf_counter() - start)
    return {key: (times[key], out[key]) for key in fns}


def positions_rows(n: int, repeats: int) -> list[dict]:
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    rows = []
    for ratio in (0.01, 0.001):
        new, old = build(f"topk:ratio={ratio}"), IndexListTopK(ratio=ratio)
        k = new.count(n)
        index = top_indices(x, k)
        lg = (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)
        formats = {"gap-coded": (new, gapcode.encode, lambda b, k=k: gapcode.decode(b, n, k, "topk")),
                   "index list (old)": (old, index_list_encode, lambda b, k=k: index_list_decode(b, n, k))}
        for c, *_ in formats.values():
            c.decode(c.encode(x[:4096]))  # warm-up
        enc = interleaved({f: (lambda c=c: c.encode(x)) for f, (c, *_) in formats.items()}, repeats)
        dec = interleaved({f: (lambda c=c, p=enc[f][1]: c.decode(p)) for f, (c, *_) in formats.items()},
                          repeats)
        pos_enc = interleaved({f: (lambda e=e, i=index: e(n, i)) for f, (_, e, _) in formats.items()}, repeats)
        pos_dec = interleaved({f: (lambda d=d, s=pos_enc[f][1]: d(s)) for f, (*_, d) in formats.items()},
                              repeats)
        for f in formats:
            assert torch.equal(dec[f][1], dec["gap-coded"][1])
            rows.append({"ratio": ratio, "format": f, "n": n, "k": k, "bits": 8 * enc[f][1].nbytes / n,
                         "limit": (32 * k + lg) / n, "index_bits": 8 * pos_enc[f][1].numel() / k,
                         "index_limit": lg / k, "enc": enc[f][0], "dec": dec[f][0],
                         "pos_enc": pos_enc[f][0], "pos_dec": pos_dec[f][0]})
    return rows


def positions_table(rows: list[dict]) -> str:
    lines = ["| ratio | positions | elements | bits/element | limit | over limit | index bits/kept "
             "| limit | encode ms | decode ms | positions enc ms | positions dec ms |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms = " | ".join(f"{1e3 * r[t]:.2f}" for t in ("enc", "dec", "pos_enc", "pos_dec"))
        lines.append(f"| {r['ratio']:g} | {r['format']} | {r['n']:,} | {r['bits']:.4f} | {r['limit']:.4f} "
                     f"| {100 * (r['bits'] / r['limit'] - 1):+.2f}% | {r['index_bits']:.3f} "
                     f"| {r['index_limit']:.3f} | {ms} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M elements only")
    add_run_flags(ap, only=("threads",))
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (best is kept)")
    ap.add_argument("--spec", action="append", help="compressor spec to run (repeatable; default: all)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--positions", action="store_true",
                    help="only the top-k position formats against the information limit")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help="elements for --positions (default 4Mi)")
    args, _ = parse_run_args(ap, argv)
    torch.set_num_threads(args.threads)
    if args.probe:
        probe(args.probe, args.size)
        return
    if args.positions:
        n = args.size or 1 << 22
        print(f"torch {torch.__version__}, {args.threads} thread(s), best of {args.repeats}; randn float32\n")
        print(positions_table(positions_rows(n, args.repeats)))
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
