"""Trajectories of Leader SGD as gradwire ran it before the authors' protocol (issue 17) was added:
no proximal pull, the election window equal to τ, the leader evaluated. Recorded once at commit
5587257 into ``data/lsgd_reference.json``; ``test_leader_sgd.py`` checks that ``prox=0`` and
``window=τ`` (``global_prox=0`` and ``global_window=τ_G`` for multi-leader) with ``eval=leader`` still give
these steps bit for bit.

Each step is recorded as its figures and a sha256 of every worker's parameters, so the file stays
small and any change of a single bit shows.

    PYTHONPATH=src python tests/algorithms/lsgd_reference.py   # rewrites the file: only on purpose
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

from gradwire.config import RunConfig
from gradwire.run.loop import Run

FILE = Path(__file__).parent / "data" / "lsgd_reference.json"
# the spec as it was, and the keys that reproduce it now
CASES = {
    "lsgd:pull=0.3,period=3": ",prox=0,window=3,eval=leader",
    "lsgd:groups=2,pull=0.5,period=2,global_pull=0.2,global_period=4":
        ",prox=0,window=2,global_prox=0,global_window=4,eval=leader",
    "lsgd:async=true,pull=0.5,period=2": ",prox=0,window=2,eval=leader",
}
STEPS = 12


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]


def trajectory(spec: str, data_dir: str, out: str) -> list[dict]:
    """Run ``spec`` on the tests' local-updates configuration; every step's figures and digests,
    then the evaluation of the last step."""
    cfg = RunConfig(task="digits-logreg", workers=4, steps=STEPS, batch_size=16, lr=0.1, momentum=0.9,
                    stragglers="lognormal:sigma=0.5,compute_s=0.05", algorithm=spec, out=out, data_dir=data_dir)
    r = Run(cfg)
    rows = []
    for _ in range(STEPS):
        info = r.train_step()
        keep = {k: v for k, v in info.items() if isinstance(v, int | float | list)}
        rows.append(keep | {"x": {str(k): digest(x) for k, x in r.algorithm.replicas.x.items()},
                            "sim_time_s": r.clock.now, "bytes_sent": r.transport.bytes_sent})
    rows.append({"eval": r.evaluate(), "eval_params": digest(r.algorithm.eval_params())})
    return rows


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        data = sys.argv[1] if len(sys.argv) > 1 else "data-cache"
        record = {spec: trajectory(spec, data, f"{tmp}/{k}") for k, spec in enumerate(CASES)}
    FILE.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {FILE}")
