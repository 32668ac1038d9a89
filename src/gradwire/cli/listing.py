"""``gradwire list``: every registered name (tasks, partitions, straggler models, networks,
algorithms, compressors, ...) with its parameters."""

from __future__ import annotations

from gradwire.registries import GROUPS, REGISTRIES


def add_parser(sub) -> None:
    p = sub.add_parser("list", help="show every task, partition, straggler model, network, algorithm, compressor")
    p.add_argument("what", nargs="?", choices=GROUPS)
    p.set_defaults(command_main=main)


def main(ns) -> int:
    for ref in REGISTRIES:
        if ns.what in (None, ref.group):
            print(f"{ref.group} (spec: name or name:key=value,...):\n{ref.registry.describe()}\n")
    return 0
