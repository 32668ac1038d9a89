"""The recovery phases of a ``--fault-tolerance`` run, read back from its ``steps.jsonl``.

Every committed step's record carries ``ft`` (fault/replica.py). A membership change is a step
whose participants differ from the step before; for each, the phases on this replica:

* **detect**: the failed attempts before the step committed (a collective that broke, a commit
  vote lost); their time is the step's wall time less its committed attempt's;
* **quorum**: the committed attempt's quorum call (the Lighthouse's answer, the process group
  rebuilt, and, on a replica that joined, the state transfer);
* **transfer**: on the replica that joined, the state's bytes and the seconds the fetch took,
  and the seconds to install it;
* **rejoin**: the step from which every replica took part again.

The run's timeline records the quorum calls as ``WAIT`` intervals and the transfers as ``COMM``
(report/timeline.py); ``gradwire report`` shows this table on the run's page.
"""

from __future__ import annotations


def phase_rows(steps: list[dict]) -> list[dict]:
    """One row per membership change (and per step that needed more than one attempt)."""
    rows, before, last_time = [], None, None
    for s in steps:
        ft = s.get("ft")
        if ft is None:
            continue
        who = ft["participants"]
        changed = before is not None and who != before
        if changed or ft["attempts"] > 1 or "healed" in ft:
            wall = None if last_time is None else s["sim_time_s"] - last_time
            healed = ft.get("healed") or {}
            rows.append({"step": s["step"], "participants": who,
                         "change": _change(before, who, "healed" in ft), "attempts": ft["attempts"],
                         "step_s": wall, "quorum_s": ft["quorum_s"],
                         "transfer_bytes": healed.get("bytes"), "transfer_s": healed.get("transfer_s"),
                         "install_s": healed.get("install_s"), "from": healed.get("from")})
        before, last_time = who, s["sim_time_s"]
    return rows


def _change(before: list[int] | None, who: list[int], healed: bool) -> str:
    if healed:
        return "this replica rejoined (recovered from a peer)"
    if before is None:
        return "start"
    gone, new = sorted(set(before) - set(who)), sorted(set(who) - set(before))
    return ", ".join([f"-{r}" for r in gone] + [f"+{r}" for r in new]) or "retried"


def report_blocks(steps: list[dict]) -> list:
    """The run page's section (report/pages.py), empty for a run without fault tolerance."""
    rows = phase_rows(steps)
    if not any("ft" in s for s in steps):
        return []
    from gradwire.report.html import Heading, Paragraph, Table

    last = next(s["ft"] for s in reversed(steps) if "ft" in s)

    def fmt(x, digits=3):
        return "" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else x

    table = Table(["step", "participants", "change", "attempts", "step (s)", "quorum (s)", "transfer (bytes)",
                   "transfer (s)", "install (s)", "from"],
                  [[r["step"], " ".join(map(str, r["participants"])), r["change"], r["attempts"], fmt(r["step_s"]),
                    fmt(r["quorum_s"]), fmt(r["transfer_bytes"]), fmt(r["transfer_s"]), fmt(r["install_s"]),
                    fmt(r["from"])] for r in rows])
    return [Heading("Fault tolerance (torchft)", 3),
            Paragraph(f"Membership changes and recovery phases on this replica (docs/fault_tolerance.md); samples "
                      f"skipped on the shards of absent replicas: {last['skipped_samples']}."), table]
