"""Once-off comparison of gradwire's ``demo`` with the DeMo authors' optimizer (bloc97/DeMo,
``demo.py``), on the same initial model and the same batches, one worker (theirs in a world of one
gloo process). Their code is not part of gradwire: put their ``demo.py`` in a folder of your own as
``demo_bloc97.py`` (and ``einops``, which it imports, on the path), then

    python benchmarks/demo_against_authors.py FOLDER STEPS LR      # e.g. /tmp/bloc97 600 0.003

It prints a table of the last 50 batch losses' mean and the final train/test figures
(docs/low_communication.md has the one we ran).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gradwire.config import RunConfig  # noqa: E402
from gradwire.run.loop import Run  # noqa: E402
from gradwire.seeding import hash_seed  # noqa: E402
from gradwire.tasks.evaluate import evaluate  # noqa: E402
from gradwire.tasks.oracle import WorkerData  # noqa: E402


def main() -> None:
    folder, steps, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    sys.path.insert(0, os.path.abspath(folder))
    from demo_bloc97 import DeMo as AuthorsDeMo  # their file, from the user's folder

    torch.set_num_threads(1)
    out = {}
    for k in (1, 2, 4):
        cfg = RunConfig(task="digits-mlp", workers=1, steps=steps, batch_size=16, lr=lr,
                        algorithm=f"demo:chunk=64,k={k}", out=f"{folder}/ours_k{k}", data_dir="data-cache",
                        eval_every=steps)
        r = Run(cfg)
        losses = [r.train_step()["loss"] for _ in range(steps)]
        ev = r.evaluate()
        out[f"gradwire demo k={k}/64 (1-D chunks)"] = (sum(losses[-50:]) / 50, ev["train_loss"], ev["test_loss"],
                                                       ev["test_acc"])
    store = tempfile.NamedTemporaryFile(delete=False).name
    dist.init_process_group("gloo", store=dist.FileStore(store, 1), rank=0, world_size=1)
    module = r.task.model_fn(torch.Generator().manual_seed(hash_seed(0, "model")))
    start = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    assert torch.equal(start, Run(cfg).model.flatten()), "not the same initial model"
    opt = AuthorsDeMo(module.parameters(), lr=lr, compression_decay=0.999, compression_topk=32, compression_chunk=64)
    w = r.oracle.workers[0]
    replay = WorkerData(w.x, w.y, batch_size=16, seed=0, rank=0)  # the batches gradwire's worker 0 drew
    losses = []
    for _ in range(steps):
        x, y = replay.next_batch()
        module.zero_grad()
        loss = r.task.loss_fn(module(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    ev = evaluate(r.task, r.model, flat)
    out["bloc97/DeMo topk=32 chunk=64 (2-D tiles)"] = (sum(losses[-50:]) / 50, ev["train_loss"], ev["test_loss"],
                                                       ev["test_acc"])
    dist.destroy_process_group()
    print(f"digits-mlp, 1 worker, {steps} steps of batch 16, lr {lr}, decay 0.999, sign update, seed 0")
    print("| optimizer | mean batch loss, last 50 steps | train loss | test loss | test acc |")
    print("|---|---|---|---|---|")
    for name, (b, tr, te, acc) in out.items():
        print(f"| {name} | {b:.4f} | {tr:.4f} | {te:.4f} | {acc:.4f} |")


if __name__ == "__main__":
    main()
