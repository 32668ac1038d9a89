"""``gradwire list``: every registered name (tasks, partitions, straggler models, networks,
algorithms, compressors, ...) with its parameters."""

from __future__ import annotations

from gradwire.registries import GROUPS, REGISTRIES


def add_parser(sub) -> None:
    p = sub.add_parser("list", help="show every task, partition, straggler model, network, algorithm, compressor",
                       description="Every registered name of each kind, with its parameters, their types and "
                                   "defaults: what a spec (name or name:key=value,...) may say.")
    p.add_argument("what", nargs="?", choices=GROUPS, metavar="WHAT",
                   help=f"one kind only: {', '.join(GROUPS)} (compressors and averagers both list what "
                        "--compressor takes)")
    p.set_defaults(command_main=main)


def main(ns) -> int:
    asked = next((r for r in REGISTRIES if r.group == ns.what), None)
    for ref in REGISTRIES:
        if asked is None or ref.key == asked.key:  # --compressor takes compressors and averagers (powersgd)
            flag = f"--{ref.key.replace('_', '-')}"
            print(f"{ref.group} ({flag}; spec: name or name:key=value,...):\n{ref.registry.describe()}\n")
    return 0
