"""Everything a session with a GPU should run, into one file (docs/gpu.md, "What a GPU session runs").

    python scripts/gpu_figures.py --only tests       # on the GPU machine, first call: the CUDA tests
    python scripts/gpu_figures.py --only benchmarks  # second call: codecs and the DDP hook
    python scripts/gpu_figures.py --dry-run          # print the commands only

The device tool gives one call at most 600 s, and only files under ``$OUT`` come back, so: the
output goes to ``--out`` (default ``$OUT/gpu-figures.md`` where ``OUT`` is set, else
``runs/gpu-figures.md``), written line by line as each command prints (a call cut off at its limit
keeps what came before), headed by the command and followed by its exit code; each command has its
own limit, after which its whole process group is ended; and the commands come in two groups, one
call each. A command that fails does not stop the next. The children find gradwire on
``PYTHONPATH`` (src/ and the repository root), so a bare machine needs no install.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

# (group, limit in seconds, command): the tests compile ~190 Triton kernel variants on a fresh cache,
# so pytest runs them on 4 processes
COMMANDS = [
    ("tests", 420, [PY, "-m", "pytest", "-q", "-n", "4", "tests/compress", "tests/kernels",
                    "tests/backends/test_devices.py", "tests/ddp", "tests/algorithms/test_outer_state.py",
                    "tests/averaging/test_scatter_mean.py", "tests/algorithms/test_muloco.py"]),
    ("benchmarks", 120, [PY, "benchmarks/gpu_codecs.py"]),
    ("benchmarks", 90, [PY, "benchmarks/gpu_codecs.py", "--dtype", "bfloat16", "--spec", "sign", "--spec", "bf16",
                        "--spec", "qsgd"]),
    ("benchmarks", 120, [PY, "benchmarks/ddp_hook.py", "--device", "cuda", "--rounds", "6"]),
    ("benchmarks", 180, [PY, "benchmarks/ddp_hook.py", "--device", "cuda", "--model", "gpt2", "--dtype", "bfloat16",
                         "--rounds", "6"]),
]
GROUPS = sorted({group for group, _, _ in COMMANDS})


def shown(command: list[str]) -> str:
    return " ".join("python" if c == PY else c for c in command)


def run_streaming(command: list[str], limit_s: float, log, env: dict) -> int:
    """Run ``command``, each line of its output to the terminal and ``log`` as it comes; after
    ``limit_s`` its process group is ended (SIGTERM, then SIGKILL) and 124 returned."""
    p = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)

    def copy():
        for line in p.stdout:
            print(line, end="", flush=True)
            log.write(line)
            log.flush()

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    try:
        code = p.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
                p.wait(timeout=10)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        log.write(f"\n(ended after its limit of {limit_s:g} s)\n")
        code = 124
    reader.join(timeout=10)
    return code


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "runs"
    p.add_argument("--out", default=str(where / "gpu-figures.md"))
    p.add_argument("--only", choices=GROUPS, help="one group of commands (each fits one call of the device tool)")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    chosen = [(g, limit, c) for g, limit, c in COMMANDS if args.only in (None, g)]
    if args.dry_run:
        for group, limit, command in chosen:
            print(f"[{group}, {limit} s] {shown(command)}")
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT),
                                                                    os.environ.get("PYTHONPATH")])))
    failed = 0
    with out.open("a") as log:
        for _, limit, command in chosen:
            log.write(f"\n## `{shown(command)}`\n\n```\n")
            log.flush()
            print(f"$ {shown(command)}", flush=True)
            start = time.monotonic()
            code = run_streaming(command, limit, log, env)
            log.write(f"```\nexit code {code}, {time.monotonic() - start:.0f} s\n")
            log.flush()
            failed += code != 0
    print(f"gpu_figures: {len(chosen) - failed}/{len(chosen)} commands succeeded; output in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
