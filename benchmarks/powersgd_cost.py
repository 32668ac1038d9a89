"""What PowerSGD's own computation costs a worker, beside its forward and backward pass.

On the language model of the test-bed passes (``stdlib-lm``, 1.45M parameters, 15 matrices compressed), one
process, one thread: the median time of one ``PowerSGD.average`` call (one worker, the allreduce an
identity, so only the computation: error feedback, the products, Gram-Schmidt, the casts) for each
rank and wire dtype, and, measured in the same run, the forward and backward pass of a batch of 8
sequences. The orthogonalisation of the factors is timed both ways on the same factors: batched by
shape (what ``average`` does: Gram-Schmidt up to rank 2, Householder QR above) and Gram-Schmidt one
matrix at a time (what it did before). Also prints the bytes each worker contributes
per step and the peak of the process's resident memory.

    python benchmarks/powersgd_cost.py [--ranks 4 8 16 32] [--repeats 20]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):  # warm-up
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    import torch

    from gradwire.averaging.powersgd import AVERAGERS, PowerSGDMemory, orthogonalize_, orthogonalized
    from gradwire.tasks.base import build_task

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--repeats", type=int, default=20)
    ns = ap.parse_args(argv)
    torch.set_num_threads(1)

    task = build_task("stdlib-lm", seed=0, num_workers=1)
    model = task.model_fn(torch.Generator().manual_seed(0))
    x, y = task.x_train[:8], task.y_train[:8]

    def forward_backward():
        model.zero_grad()
        task.loss_fn(model(x), y).backward()

    fb = median_ms(forward_backward, ns.repeats)
    grads = [p.grad.clone() for p in model.parameters()]
    keys = [str(i) for i in range(len(grads))]
    print(f"forward + backward, batch 8 x 64 bytes: {fb:.1f} ms")
    print("| rank | dtype | bytes/worker/step | average(), ms | of fwd+bwd "
          "| orthogonalisation: batched (QR above rank 2) / Gram-Schmidt per matrix, ms |")
    print("|---|---|---|---|---|---|")
    for rank in ns.ranks:
        for dtype in ("fp32", "fp16"):
            powersgd = AVERAGERS.build(f"powersgd:rank={rank},dtype={dtype}")
            memory = PowerSGDMemory(seed=0)

            def step(powersgd=powersgd, memory=memory):
                powersgd.average(memory, {0: grads}, keys, lambda t: t[0].float())
                memory.step += 1

            ms = median_ms(step, ns.repeats)
            nbytes = powersgd.wire_numel([g.shape for g in grads]) * powersgd.wire_dtype(torch.float32).itemsize
            ps = [g.reshape(g.shape[0], -1) @ memory.q[k] for g, k in zip(grads, keys, strict=True) if k in memory.q]
            batched = median_ms(lambda ps=ps: orthogonalized(ps), ns.repeats)
            single = median_ms(lambda ps=ps: [orthogonalize_(p.clone()) for p in ps], ns.repeats)
            print(f"| {rank} | {dtype} | {nbytes:,} | {ms:.1f} | {ms / fb:.0%} | {batched:.1f} / {single:.1f} |")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory: {peak_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
