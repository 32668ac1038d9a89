"""Two network namespaces joined by one link, to cut or throttle a replica's network (tests and
benchmarks of ``--fault-tolerance``; needs root and ``ip`` from iproute2).

:class:`Link` makes namespaces ``<name>-a`` and ``<name>-b`` and one veth pair between them,
``10.203.0.1/24`` on side a and ``10.203.0.2/24`` on side b (each namespace has its own addresses,
so several links can use the same ones at once), and nothing else: neither side reaches the
machine's own network or loopback. A process runs on a side through :meth:`prefix`
(``ip netns exec NAME``, which execs the command: the process's id is the command's).

* :meth:`cut` sets side a's end of the link down: a partition. Side a's kernel drops its route
  to side b (sends fail at once); side b's end loses its carrier, and what it sends is dropped
  silently (its connections see nothing until their own timeouts).
* :meth:`restore` sets it up again.
* :meth:`throttle` puts a token-bucket rate limit (``tc ... tbf``) on both ends (this kernel has
  no ``netem``, so no loss or delay model); :meth:`unthrottle` removes it. :meth:`stats` reads
  what each end's qdisc has counted: the bytes it sent, and how often the bucket held a packet back
  (``overlimits``: traffic beyond the burst, which the rate limit then paced).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

ADDRESSES = {"a": "10.203.0.1", "b": "10.203.0.2"}
DEVICES = {"a": "gwa", "b": "gwb"}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (one line), or None when they can."""
    if os.name != "posix" or os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "network namespaces need iproute2's ip and tc"
    probe = f"gwprobe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        err = getattr(e, "stderr", b"") or b""
        return f"cannot make a network namespace: {err.decode(errors='replace').strip() or e}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


class Link:
    def __init__(self, name: str | None = None):
        self.name = name or f"gwft-{os.getpid()}-{id(self) & 0xFFFF:x}"
        self.ns = {side: f"{self.name}-{side}" for side in "ab"}
        self.throttled = False
        made = []
        try:
            for side in "ab":
                _ip("netns", "add", self.ns[side])
                made.append(side)
            _ip("link", "add", DEVICES["a"], "netns", self.ns["a"], "type", "veth",
                "peer", "name", DEVICES["b"], "netns", self.ns["b"])
            for side in "ab":
                _ip("-n", self.ns[side], "addr", "add", f"{ADDRESSES[side]}/24", "dev", DEVICES[side])
                _ip("-n", self.ns[side], "link", "set", DEVICES[side], "up")
                _ip("-n", self.ns[side], "link", "set", "lo", "up")
        except BaseException:
            for side in made:
                subprocess.run(["ip", "netns", "del", self.ns[side]], capture_output=True, timeout=30)
            raise

    def prefix(self, side: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[side]]

    def address(self, side: str) -> str:
        return ADDRESSES[side]

    def device(self, side: str) -> str:
        return DEVICES[side]

    def cut(self) -> None:
        _ip("-n", self.ns["a"], "link", "set", DEVICES["a"], "down")

    def restore(self) -> None:
        _ip("-n", self.ns["a"], "link", "set", DEVICES["a"], "up")

    def throttle(self, rate: str = "1mbit", burst: str = "32kb", latency: str = "200ms") -> None:
        for side in "ab":
            subprocess.run(["tc", "-n", self.ns[side], "qdisc", "replace", "dev", DEVICES[side], "root", "tbf",
                            "rate", rate, "burst", burst, "latency", latency],
                           check=True, capture_output=True, timeout=30)
        self.throttled = True

    def stats(self) -> dict[str, dict]:
        """Each side's root qdisc on its end of the link: ``{"kind", "sent_bytes", "overlimits"}``
        (``tc -s qdisc``; kind ``tbf`` while throttled, the default one otherwise)."""
        out = {}
        for side in "ab":
            text = subprocess.run(["tc", "-s", "-n", self.ns[side], "qdisc", "show", "dev", DEVICES[side]],
                                  check=True, capture_output=True, text=True, timeout=30).stdout
            root = re.search(r"qdisc (\S+) \S+ root.*?Sent (\d+) bytes \d+ pkt \(dropped \d+, overlimits (\d+)",
                             text, re.S)
            if root is None:
                raise RuntimeError(f"no root qdisc in tc's answer for {self.ns[side]}: {text!r}")
            out[side] = {"kind": root[1], "sent_bytes": int(root[2]), "overlimits": int(root[3])}
        return out

    def unthrottle(self) -> None:
        for side in "ab":
            subprocess.run(["tc", "-n", self.ns[side], "qdisc", "del", "dev", DEVICES[side], "root"],
                           capture_output=True, timeout=30)
        self.throttled = False

    def close(self) -> None:
        """Delete both namespaces (and the link with them); processes still inside keep theirs."""
        for side in "ab":
            subprocess.run(["ip", "netns", "del", self.ns[side]], capture_output=True, timeout=30)
