"""The simulator's network model against a real bandwidth-limited network.

    sudo .venv/bin/python benchmarks/network_model_check.py                  # 2 and 4 nodes, 10/100/1000 Mbit/s
    sudo .venv/bin/python benchmarks/network_model_check.py --nodes 2 --mbps 100 --realtime

Each case runs `sync:overlap=false` (one blocking allreduce of the whole gradient a step) on the
namespace test bed (scripts/testbed.py: one gloo process per namespace, token-bucket links of
``--mbps`` each way) and reads each step's allreduce from the run's timeline: on a real backend a
collective's interval is split where the last rank entered it (report/timeline.py,
``split_collective_waits``), so what is left is the transfer itself. Its median over steps (the
first ``SKIP`` left out: connection set-up) is set beside gradwire's ring model
(``transports/network.py``, ``RingNetwork.allreduce``: 2(n-1)(latency + B/(n·bw)), Patarasuk &
Yuan 2009) for the payload B that the byte ledger counted, at the bed's latency (0: this kernel has
no netem). The bytes the veth interfaces carried are set beside the ledger's: the difference is
the frames' own headers and the TCP acknowledgements, which the ledger (payload only) leaves out;
the column "model × wire/ledger" prices those measured bytes too, and what error is left is latency
(gloo's per-message cost, queueing in the token bucket) and, where nodes outnumber cores, the CPU.

``--collective scatter`` checks the compressed mean's scatter route instead (``--compressed-mean
scatter``: two all-to-alls, ``Network.alltoall``: latency + (n-1)·slot/bw each, every message posted
at once): `sync` with the 1-bit scaled sign message and error feedback, its exchange read from the
``WAIT`` record of the step's mean (on the torch backend both all-to-alls and the owners' reduction
run on the transport's own thread while the caller waits), the rank that waited least per step (the
last to arrive: the others' records include their wait for it), against the model for the slot the
ledger counted.

``--realtime`` runs the bed under ``chrt --rr 1``: the nodes' processes then take a core before
any ordinary process of this shared machine, so a case measures the network and gloo rather than
the neighbours' load (the 1-minute load average is recorded either way).

Results go to ``--out`` (default runs/network-model): one folder per case and ``results.json``,
``results.md``; docs/time_to_accuracy.md quotes the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from gradwire.cli.flags import add_run_flags, parse_run_args
from testbed_time_to_accuracy import this_checkout_env  # the nodes import this checkout's gradwire

ROOT = Path(__file__).resolve().parents[1]
TESTBED = ROOT / "scripts" / "testbed.py"
TASK = "stdlib-lm:dim=64,layers=2,heads=2"   # the time-to-quality task: a 548,864-byte float32 gradient
STEPS = {10.0: 16, 100.0: 40, 1000.0: 80}     # enough steps for a median, a few seconds of wire each
SKIP = 3                                      # first steps left out: gloo's pairs connect lazily


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def allreduce_seconds(run_dir: Path) -> list[float]:
    """Per step (from SKIP on), the median over ranks of the allreduce's transfer time."""
    import numpy as np

    from gradwire.report.timeline import COMM, read_timeline

    recs, _ = read_timeline(run_dir, overlapped=False)
    comm = recs[(recs["kind"] == COMM) & (recs["step"] >= SKIP)]
    out = []
    for step in np.unique(comm["step"]):
        one = comm[comm["step"] == step]
        out.append(float(np.median(one["end"] - one["start"])))
    return out


def exchange_seconds(run_dir: Path) -> list[float]:
    """Per step (from SKIP on), the scatter route's two all-to-alls: the shortest ``WAIT`` among the
    ranks (the last to arrive waits for the transfer alone)."""
    import numpy as np

    from gradwire.report.timeline import WAIT, read_timeline

    recs, _ = read_timeline(run_dir, overlapped=False)
    wait = recs[(recs["kind"] == WAIT) & (recs["step"] >= SKIP)]
    return [float(np.min(wait[wait["step"] == step]["end"] - wait[wait["step"] == step]["start"]))
            for step in np.unique(wait["step"])]


def scatter_model_seconds(slot_bytes: float, nodes: int, mbps: float, latency_ms: float) -> float:
    from gradwire.transports.network import RingNetwork

    return 2 * RingNetwork(mbps=mbps, latency_ms=latency_ms).alltoall(int(slot_bytes), nodes).time_s


def model_seconds(payload_bytes: float, nodes: int, mbps: float, latency_ms: float) -> float:
    from gradwire.transports.network import RingNetwork

    return RingNetwork(mbps=mbps, latency_ms=latency_ms).allreduce(int(payload_bytes), nodes).time_s


SCATTER_FLAGS = ["--compressor", "sign:scaled=true", "--error-feedback", "--compressed-mean", "scatter"]


def run_case(nodes: int, mbps: float, out: Path, realtime: bool, timeout_s: float, queue_ms: float,
             steps: int | None = None, collective: str = "allreduce") -> dict:
    folder = out / (f"n{nodes}-{mbps:g}mbps-q{queue_ms:g}" + ("-scatter" if collective == "scatter" else ""))
    steps = steps or STEPS.get(mbps, 40)
    cmd = [sys.executable, str(TESTBED), "--nodes", str(nodes), "--mbps", f"{mbps:g}", "--timeout-s", str(timeout_s),
           "--queue-ms", f"{queue_ms:g}", "--prefix", f"gwn-{os.getpid()}-{nodes}", "--",
           "run", "--task", TASK, "--algorithm", "sync:overlap=false",
           "--optimizer", "adamw:beta2=0.95", "--weight-decay", "0.1", "--lr", "0.002", "--batch-size", "8",
           "--steps", str(steps), "--eval-every", "100000", "--threads", "1", "--out", str(folder), "--overwrite",
           *(SCATTER_FLAGS if collective == "scatter" else [])]
    if realtime:
        cmd = ["chrt", "--rr", "1", *cmd]
    before = loadavg()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 60, cwd=ROOT, env=this_checkout_env())
    if p.returncode != 0:
        raise RuntimeError(f"test bed at {nodes} nodes, {mbps:g} Mbit/s failed ({p.returncode}):\n{p.stderr[-3000:]}")
    after = loadavg()
    metrics = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = metrics[-1]
    ledger_bytes = last["bytes_sent"]
    bed = json.loads((folder / "testbed" / "testbed.json").read_text())
    wire = sum(x["tx_bytes"] for x in bed["links"])
    if collective == "scatter":  # the ledger's two all-to-alls of one slot a step
        payload = ledger_bytes / (2 * nodes * (nodes - 1)) / last["step"]
        measured, model = exchange_seconds(folder), scatter_model_seconds(payload, nodes, mbps, 0.0)
    else:
        payload = ledger_bytes / (2 * (nodes - 1)) / last["step"]
        measured, model = allreduce_seconds(folder), model_seconds(payload, nodes, mbps, 0.0)
    med = statistics.median(measured)
    return {"nodes": nodes, "mbps": mbps, "collective": collective, "steps": last["step"], "payload_bytes": payload,
            "measured_s": med, "measured_spread_s": [min(measured), max(measured)], "model_s": model,
            "model_error": model / med - 1, "ledger_bytes": ledger_bytes, "wire_bytes": wire,
            "wire_over_ledger": wire / ledger_bytes - 1, "load_before": before, "load_after": after,
            "realtime": realtime, "queue_ms": queue_ms,
            "drops": sum(x["upload_drops"] + x["download_drops"] for x in bed["links"])}


def markdown(results: list[dict]) -> str:
    lines = ["| nodes | Mbit/s | collective | tbf queue | measured (median; range) | model | model error "
             "| wire bytes vs ledger | model × wire/ledger: error | packets dropped | load (1-min, before/after) "
             "| real-time |", "|---" * 12 + "|"]
    for r in results:
        lo, hi = r["measured_spread_s"]
        priced = r["model_s"] * (1 + r["wire_over_ledger"]) / r["measured_s"] - 1
        what = "two all-to-alls" if r.get("collective") == "scatter" else "allreduce"
        lines.append(f"| {r['nodes']} | {r['mbps']:g} | {what} | {r['queue_ms']:g} ms "
                     f"| {1e3 * r['measured_s']:.1f} ms ({1e3 * lo:.1f}-{1e3 * hi:.1f}) "
                     f"| {1e3 * r['model_s']:.1f} ms | {100 * r['model_error']:+.1f} % "
                     f"| {100 * r['wire_over_ledger']:+.1f} % "
                     f"| {100 * priced:+.1f} % | {r['drops']} | {r['load_before']:.1f}/{r['load_after']:.1f} "
                     f"| {'yes' if r['realtime'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", default="2,4", help="node counts, comma-separated (default 2,4)")
    p.add_argument("--mbps", default="10,100,1000", help="link rates in Mbit/s, comma-separated (default 10,100,1000)")
    p.add_argument("--realtime", action="store_true", help="run the bed under chrt --rr 1 (see above)")
    p.add_argument("--queue-ms", type=float, default=50.0,
                   help="each tbf queue's depth in milliseconds of the rate (scripts/testbed.py; default 50)")
    p.add_argument("--case-steps", type=int, default=None,
                   help=f"steps a case (default by rate: {', '.join(f'{k:g} Mbit/s {v}' for k, v in STEPS.items())})")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per case (default 600)")
    p.add_argument("--collective", choices=("allreduce", "scatter"), default="allreduce",
                   help="allreduce: sync's dense allreduce; scatter: the compressed mean's scatter route (above)")
    add_run_flags(p, only=("out",), defaults={"out": "runs/network-model"}, helps={"out": "the results folder"})
    args, _ = parse_run_args(p, argv)
    try:
        nodes = [int(x) for x in args.nodes.split(",")]
        rates = [float(x) for x in args.mbps.split(",")]
    except ValueError:
        p.error(f"--nodes and --mbps take comma-separated numbers, got {args.nodes!r} and {args.mbps!r}")
    if args.case_steps is not None and args.case_steps <= SKIP:
        p.error(f"--case-steps must be > {SKIP} (the first {SKIP} steps are left out), got {args.case_steps}")
    if os.geteuid() != 0:
        print("network_model_check: the test bed needs root (network namespaces)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "src"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else []
    for n in nodes:
        for mbps in rates:
            r = run_case(n, mbps, out, args.realtime, args.timeout_s, args.queue_ms, args.case_steps, args.collective)
            key = (n, mbps, args.realtime, args.queue_ms, args.collective)
            results = [x for x in results if (x["nodes"], x["mbps"], x["realtime"], x.get("queue_ms"),
                                              x.get("collective", "allreduce")) != key] + [r]
            path.write_text(json.dumps(results, indent=1) + "\n")
            print(markdown([r]).splitlines()[-1], flush=True)
    order = sorted(results, key=lambda r: (r.get("collective", "allreduce"), r["realtime"], r["queue_ms"], r["nodes"],
                                           r["mbps"]))
    (out / "results.md").write_text(markdown(order))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
