"""How long a user waits for a bad argument to be reported: ``gradwire`` run as a new process on
inputs that are wrong before anything could run, each timed from exec to exit.

CPU time of the child (user + system, from ``resource.getrusage(RUSAGE_CHILDREN)``) is the
figure to compare on a shared machine; wall time is printed beside it. Each case also says whether
torch was imported (``-X importtime`` lists every module the process imported).

    python benchmarks/time_to_typo.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "run --workers 0": ["run", "--workers", "0"],
    "run --lr -1": ["run", "--lr", "-1"],
    "run --wokers 8 (unknown flag)": ["run", "--wokers", "8"],
    "run --algorithm synk (unknown name)": ["run", "--algorithm", "synk"],
    "run --compressor qsgd:levls=4 (unknown key)": ["run", "--compressor", "qsgd:levls=4"],
    "rn (unknown command)": ["rn"],
    "run --config broken.yaml": ["run", "--config", "{broken}"],
    "--help": ["--help"],
    "run --help": ["run", "--help"],
}


def measure(args: list[str], repeats: int) -> dict:
    cpu, wall, torch_imported = [], [], False
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "gradwire", *args],
                              capture_output=True, text=True, timeout=300)
        wall.append(time.perf_counter() - began)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        torch_imported = any(line.split("|")[-1].strip() == "torch" for line in done.stderr.splitlines())
    return {"cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall), "torch": torch_imported,
            "exit": done.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    ns = parser.parse_args()
    broken = Path("time-to-typo-broken.yaml")
    broken.write_text("workers: 4\n  steps: [1\n")
    try:
        print(f"{'command':39} {'exit':>4} {'cpu s':>7} {'wall s':>7}  torch imported")
        for name, args in CASES.items():
            args = [str(broken) if a == "{broken}" else a for a in args]
            m = measure(args, ns.repeats)
            print(f"gradwire {name:30} {m['exit']:>4} {m['cpu_s']:7.3f} {m['wall_s']:7.3f}  {m['torch']}")
    finally:
        broken.unlink()


if __name__ == "__main__":
    main()
