"""Everything a session with a GPU should run, in one call, into one file (docs/gpu.md, "What a
GPU session runs").

    python scripts/gpu_figures.py                    # on the GPU machine: tests, codecs, DDP hook
    python scripts/gpu_figures.py --dry-run          # print the commands only

Each command runs in turn with a time limit; its output goes to the terminal and to
``--out`` (default ``runs/gpu-figures.md``), headed by the command and followed by its exit code,
so that the file can be pasted into docs/gpu.md. A command that fails does not stop the next.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

COMMANDS = [
    [PY, "-m", "pytest", "-q", "-p", "no:xdist", "tests/compress", "tests/kernels", "tests/backends/test_devices.py",
     "tests/ddp", "tests/algorithms/test_outer_state.py"],
    [PY, "benchmarks/gpu_codecs.py"],
    [PY, "benchmarks/gpu_codecs.py", "--dtype", "bfloat16", "--spec", "sign", "--spec", "bf16", "--spec", "qsgd"],
    [PY, "benchmarks/ddp_hook.py", "--device", "cuda", "--rounds", "6"],
    [PY, "benchmarks/ddp_hook.py", "--device", "cuda", "--model", "gpt2", "--dtype", "bfloat16", "--rounds", "6"],
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "runs" / "gpu-figures.md"))
    p.add_argument("--timeout-s", type=float, default=1800.0, help="limit per command")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.dry_run:
        for command in COMMANDS:
            print(" ".join(Path(c).name if c == PY else c for c in command))
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    failed = 0
    with out.open("w") as log:
        for command in COMMANDS:
            shown = " ".join("python" if c == PY else c for c in command)
            log.write(f"\n## `{shown}`\n\n```\n")
            start = time.monotonic()
            try:
                done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout_s)
                text, code = done.stdout + done.stderr, done.returncode
            except subprocess.TimeoutExpired as e:
                text, code = f"{e.stdout or ''}{e.stderr or ''}\n(timed out after {args.timeout_s:g} s)", 124
            print(f"$ {shown}\n{text}", flush=True)
            log.write(f"{text}```\nexit code {code}, {time.monotonic() - start:.0f} s\n")
            failed += code != 0
    print(f"gpu_figures: {len(COMMANDS) - failed}/{len(COMMANDS)} commands succeeded; output in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
