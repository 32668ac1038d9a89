"""The table and plots of benchmarks/time_to_quality.py, from the curves its stages wrote:
``results.md`` and ``results.json`` (every figure), ``quality_vs_time_w<W>.png`` (a panel per rate)
and ``quality_vs_bytes_w<W>.png``. What did not run is said so in the table, never left out."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from time_to_quality import (
    LRS,
    RATES_MBPS,
    ROWS,
    evaluation_noise,
    fastest_priced,
    late_losses,
    markdown,
    quality_at_rate,
    quarter_gain,
    read_curve,
    row_cost,
    run_folder,
    step_seconds,
    step_time_table,
    table_rows,
    target_quality,
)

TORCH_ROWS = ("ddp-bf16", "ddp-accum2", "ddp-accum4", "ddp-accum8", "torch-powersgd")  # what PyTorch alone gives
# every other row is gradwire's (its methods, and its sync with Muon): derived, so that a new row is never left out
# of the targets' table
GRADWIRE_ROWS = tuple(r.key for r in ROWS if r.key != "ddp" and r.key not in TORCH_ROWS)


def load_results(out: Path, workers: int, seeds, lrs: dict) -> dict:
    """{row: [curve per seed that ran]} at the row's tuned learning rate."""
    results = {}
    for row in ROWS:
        lr = lrs.get(row.key)
        if lr is None:
            continue
        curves = [read_curve(run_folder(out, row, lr, s, workers)) for s in seeds]
        curves = [c for c in curves if c]
        if curves:
            results[row.key] = curves
    return results


def ddp_reference(results: dict, n_steps: int) -> dict:
    """The target (DDP's quality at N, averaged over its seeds) and the two checks on N and on
    the validation set: DDP's gain over its last quarter, one evaluation's scatter (after N/2)."""
    runs = results["ddp"]
    qualities = [target_quality(r["steps"], r["losses"], n_steps) for r in runs]
    return {"target": statistics.mean(qualities), "per_seed": qualities,
            "quarter_gain": [quarter_gain(r["steps"], r["losses"], n_steps) for r in runs],
            "evaluation_noise": [evaluation_noise(late_losses(r["steps"], r["losses"], n_steps)) for r in runs]}


def tuning_table(lrs: dict) -> str:
    """Every trial's quality at N on the tuning seed (the best in bold), and DDP's plateau and
    scatter under each."""
    head = "| row | " + " | ".join(f"lr {lr:g}" for lr in LRS) + " | chosen |\n" + "|---" * (len(LRS) + 2) + "|\n"
    lines = []
    for row in ROWS:
        trials = lrs.get(f"{row.key}:trials")
        if not trials:
            lines.append(f"| {row.label} |" + " not run |" * len(LRS) + " — |\n")
            continue
        cells = []
        for lr in LRS:
            t = trials.get(f"{lr:g}")
            q = None if t is None else t["quality"]
            text = "—" if q is None else "diverged" if not math.isfinite(q) else f"{q:.4f}"
            cells.append(f"**{text}**" if lr == lrs[row.key] else text)
        lines.append(f"| {row.label} | " + " | ".join(cells) + f" | {lrs[row.key]:g} |\n")
    ddp = lrs.get("ddp:trials", {})
    plateau = "".join(f"| {lr} | {t['quarter_gain']:.2%} | {t['evaluation_noise']:.2%} |\n" for lr, t in ddp.items())
    return (head + "".join(lines) + "\nDDP on the tuning seed, per trial: gain over the last quarter before N "
            "(< 2 % asked) and one evaluation's scatter after N/2 (< 0.5 % asked):\n\n| lr | quarter gain | "
            "scatter |\n|---|---|---|\n" + plateau)


def targets(lines: list[dict], workers: int) -> str:
    """The issue's targets: gradwire's best row against DDP on a network of zero cost (≤ 1.25x at
    100 Mbit/s, ≤ 1.5x at 10 Mbit/s), the plain ratio to DDP, and PyTorch's own best hook."""
    goal = {100.0: 1.25, 10.0: 1.5, 1000.0: None}
    out = [f"\n#### Targets at {workers} workers\n\n| rate | gradwire's best row | time / DDP at zero cost | target | "
           "DDP's time / its time | PyTorch's best (DDP, hooks, accumulation) | its time / DDP at zero cost |\n"
           "|---|---|---|---|---|---|---|\n"]
    def best(keys, mbps):
        got = [x for x in lines if x["key"] in keys and x.get(f"x@{mbps}") is not None]
        return min(got, key=lambda x: x[f"x@{mbps}"]) if got else None

    for mbps in RATES_MBPS:
        gw, pt = best(GRADWIRE_ROWS, mbps), best(("ddp", *TORCH_ROWS), mbps)
        want = goal[mbps]
        gw_text = ("none reached the target", "—", "—") if gw is None else (
            gw["label"], f"{gw[f'x@{mbps}']:.2f}x", f"{gw[f'vs_ddp@{mbps}']:.2f}x")
        verdict = "—" if want is None else f"≤ {want}x: " + (
            "not reached" if gw is None else "met" if gw[f"x@{mbps}"] <= want else
            f"missed, {gw[f'x@{mbps}'] / want:.1f}x the target")
        pt_text = ("—", "—") if pt is None else (pt["label"], f"{pt[f'x@{mbps}']:.2f}x")
        out.append(f"| {mbps:g} Mbit/s | {gw_text[0]} | {gw_text[1]} | {verdict} | {gw_text[2]} | {pt_text[0]} | "
                   f"{pt_text[1]} |\n")
    return "".join(out)


def plot(out: Path, results: dict, compute: dict, workers: int, target: float, network: str = "ring") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(RATES_MBPS), figsize=(5 * len(RATES_MBPS), 4), sharey=True)
    fig_b, ax_b = plt.subplots(figsize=(6, 4))
    colours = plt.get_cmap("tab20")  # a colour per row (tab10 repeats after ten rows)
    drawn = [row for row in ROWS if results.get(row.key) and compute.get(row.key)]  # a colour per drawn row:
    for i, row in enumerate(drawn):  # tab20 gives its last colour to every index past 19
        runs, cost = results[row.key], row_cost(compute, row.key)
        run = runs[0]  # the first seed's curve (the table gives the spread)
        if row.key == "ddp":  # the reference of the targets: DDP on a network of zero cost
            for ax in axes:
                ax.plot([s * cost["compute_s"] for s in run["steps"]], run["losses"], color="grey", ls=":",
                        label="DDP, network of zero cost")
        for ax, mbps in zip(axes, RATES_MBPS):
            t = step_seconds(row, cost, workers, mbps, network)
            ax.plot([s * t for s in run["steps"]], run["losses"], label=row.label, color=colours(i), marker=".", ms=3)
        ax_b.plot([max(b, 1) / 1e6 for b in run["bytes"]], run["losses"], label=row.label, color=colours(i),
                  marker=".", ms=3)
    from matplotlib.ticker import NullFormatter

    for ax, mbps in zip(axes, RATES_MBPS):
        ax.axhline(target, color="k", lw=0.8, ls="--")
        star = ", server rows: ps" if any(row.collective == "server" for row in drawn) else ""
        ax.set(xscale="log", title=f"{mbps:g} Mbit/s, {workers} workers, {network}{star}", xlabel="modelled time (s)")
        ax.xaxis.set_minor_formatter(NullFormatter())  # (log axes label minor ticks over each other)
    axes[0].set_ylabel("validation loss")
    low = min(min(r[0]["losses"]) for r in results.values())
    axes[0].set_ylim(low * 0.99, target * 1.15)
    handles, labels = axes[0].get_legend_handles_labels()
    columns = 4  # the labels run to 70 characters: five columns were wider than the three panels
    legend_rows = -(-len(labels) // columns)  # the legend below the panels, clear of their axis labels:
    height = 4 + 0.18 * legend_rows    # its rows take about 0.13 in each, plus 0.3 in for the axis labels
    fig.set_figheight(height)
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=7)
    fig.tight_layout(rect=(0, (0.3 + 0.13 * legend_rows) / height, 1, 1))
    suffix = "" if network == "ring" else f"_{network}"
    # bbox "tight": the saved image grows to hold the legend whole, whatever the labels' length
    fig.savefig(out / f"quality_vs_time_w{workers}{suffix}.png", dpi=110, bbox_inches="tight")
    ax_b.axhline(target, color="k", lw=0.8, ls="--")
    ax_b.xaxis.set_minor_formatter(NullFormatter())
    ax_b.set(xscale="log", xlabel="MB sent, all workers (ledger)", ylabel="validation loss",
             ylim=(low * 0.99, target * 1.15), title=f"{workers} workers")
    ax_b.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1))  # beside the axes: a row per curve
    fig_b.savefig(out / f"quality_vs_bytes_w{workers}.png", dpi=110,  # bytes: the same whatever prices them
                  bbox_inches="tight")
    plt.close("all")


def write_report(out: Path, workers: list[int], seeds: list[int], lrs: dict, n_steps: int,
                 network: str = "ring") -> None:
    """results.md and results.json (``network`` not ring: results-<network>.md/.json), and the plots."""
    compute = json.loads((out / "compute.json").read_text()) if (out / "compute.json").exists() else {}
    collectives = "" if network == "ring" else f"; collectives priced as {network}, transports/network.py"
    text = [f"# Time to DDP's quality (N = {n_steps}; table seeds {seeds}; learning rates tuned on seed 0"
            f"{collectives})\n",
            "\n## Tuning (seed 0, each trial to N): validation loss at N\n\n", tuning_table(lrs)]
    everything = {"n_steps": n_steps, "seeds": seeds, "lrs": lrs, "compute": compute, "network": network,
                  "workers": {}}
    for w in workers:
        results = load_results(out, w, seeds, lrs)
        if "ddp" not in results:
            text.append(f"\n### {w} workers: not run (no DDP curve, so no target)\n")
            continue
        ref = ddp_reference(results, n_steps)
        lines = table_rows(ref["target"], results, compute, w, network)
        text.append(markdown(lines, w, ref["target"]))
        text.append(f"\nSeeds per row: {', '.join(f'{k} {len(v)}' for k, v in results.items())}. DDP over its last "
                    f"quarter before N improves {', '.join(f'{g:.2%}' for g in ref['quarter_gain'])} (per seed); one "
                    f"evaluation scatters {', '.join(f'{e:.2%}' for e in ref['evaluation_noise'])} (after N/2).\n")
        text.append(targets(lines, w))
        text.append(quality_at_rate(lines))
        everything["workers"][str(w)] = {"reference": ref, "rows": lines,
                                         "seeds": {k: [c["seed"] for c in v] for k, v in results.items()}}
        plot(out, results, compute, w, ref["target"], network)
    if "ddp" in compute:
        text.append("\n### The time model alone: step time / DDP's step on a network of zero cost\n\n"
                    + step_time_table(compute, network))
        shown = [row.key for row in ROWS if row.key in compute]
        unpaired = fastest_priced(compute, shown)
        text.append("\nEach row's step is its median ratio to the DDP measured beside it, block by block, times "
                    "DDP's step (`compute_ratio`)"
                    + (f"; priced by their fastest block instead (no DDP blocks of their session kept; "
                       f"`compute --rows` measures them again): {', '.join(unpaired)}.\n" if unpaired else ".\n"))
    name = "results" if network == "ring" else f"results-{network}"
    (out / f"{name}.md").write_text("".join(text))
    (out / f"{name}.json").write_text(json.dumps(everything, indent=1, default=str) + "\n")
    print("".join(text))
