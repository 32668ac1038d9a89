"""--fault-tolerance: the spec, the checks that refuse timeouts that cannot work together, the
install hint without torchft, and the rule that splits a peer's state into shared and own parts."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from gradwire.config import RunConfig
from gradwire.errors import ConfigError
from gradwire.fault.replica import merge_own
from gradwire.run.combination import check_combination
from gradwire.transports.ft_spec import INSTALL, parse

pytest.importorskip("torchft")

GOOD = "torchft:min_replicas=2,timeout_s=10,lighthouse=127.0.0.1:29510,replica=1"


def cfg(spec: str, **kw) -> RunConfig:
    return RunConfig(**({"backend": "torch", "workers": 3, "fault_tolerance": spec, "timeout_s": 60} | kw))


def test_spec_parses_and_default_is_off():
    ft = parse(GOOD)
    assert (ft.min_replicas, ft.timeout_s, ft.replica, ft.lighthouse_url) == (2, 10.0, 1, "http://127.0.0.1:29510")
    assert parse("none") is None
    assert check_combination(cfg(GOOD)).cfg.fault_tolerance == GOOD
    for lighthouse in ("http://lighthouse.example:29510", "[::1]:29510"):  # a scheme, an IPv6 address
        assert parse(f"torchft:lighthouse={lighthouse}").lighthouse == lighthouse


@pytest.mark.parametrize("spec, kw, says", [
    ("raft:min_replicas=2", {}, "valid choices are none, torchft"),
    (GOOD + ",colour=red", {}, "unknown key 'colour'"),
    ("torchft:min_replicas=2", {}, "needs lighthouse=HOST:PORT"),
    (GOOD.replace("min_replicas=2", "min_replicas=4"), {}, "min_replicas=4 must be in [1, --workers 3]"),
    (GOOD.replace("replica=1", "replica=3"), {}, "replica=3 must be in [0, --workers 3)"),
    (GOOD + ",quorum_timeout_s=5", {}, "quorum_timeout_s=5 is shorter than timeout_s=10"),
    (GOOD + ",quorum_timeout_s=inf", {}, "timeouts must be > 0 and finite"),
    (GOOD + ",heartbeat_ms=20000", {}, "heartbeat_ms=20000 must be shorter than timeout_s=10 s: the Lighthouse's "
                                       "heartbeat_timeout_ms must lie between the two"),
    (GOOD.replace("127.0.0.1:29510", "not-a-host-port"), {},
     "lighthouse='not-a-host-port' must be HOST:PORT with a port in [1, 65535]"),
    (GOOD.replace("127.0.0.1:29510", "127.0.0.1:99999"), {}, "lighthouse='127.0.0.1:99999' must be HOST:PORT"),
    (GOOD.replace("127.0.0.1:29510", ":29510"), {}, "lighthouse=':29510' must be HOST:PORT"),
    (GOOD, {"timeout_s": 5}, "timeout_s=10 exceeds --timeout-s 5"),
    (GOOD, {"backend": "sim"}, "needs --backend torch"),
    (GOOD, {"algorithm": "sync:backups=1"}, "server-mode algorithms"),
    (GOOD, {"algorithm": "streaming-diloco:overlap=1"}, "use streaming-diloco with overlap=0 and no eager"),
    (GOOD, {"algorithm": "streaming-diloco:overlap=0,eager=true"}, "eager=true"),
    # a healed replica would start the average its peers merged long ago (or never started)
    (GOOD, {"algorithm": "dasgd:period=4,delay=2"}, "dasgd with delay > 0"),
])
def test_settings_that_cannot_work_are_refused_in_one_line(spec, kw, says):
    with pytest.raises(ConfigError) as e:
        check_combination(cfg(spec, **kw))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_without_torchft_the_flag_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else real(name, *a))
    with pytest.raises(ConfigError, match="pip install 'gradwire\\[ft\\]'"):
        check_combination(cfg(GOOD))
    assert INSTALL == "pip install 'gradwire[ft]'"


def test_merge_keeps_the_peers_shared_state_and_this_workers_own():
    peer = {"x": torch.ones(2), "opt": {"momentum": torch.full((2,), 3.0)},
            "codec": {"error_feedback": {"0": torch.full((2,), 9.0)}, "generators": {"0": torch.tensor([1])},
                      "powersgd": {"q": {"0": torch.ones(2)}, "errors": {"0": {"0": torch.ones(2)}}}},
            "outer": {"0": {"m": torch.ones(1)}}}
    own = {"x": torch.zeros(2), "opt": {"momentum": torch.zeros(2)},
           "codec": {"error_feedback": {"2": torch.zeros(2)}, "generators": {"2": torch.tensor([7])},
                     "powersgd": {"q": {}, "errors": {}}},  # (both filled at the first step)
           "outer": {}}
    merged = merge_own(peer, own, ["codec/error_feedback", "codec/generators", "codec/powersgd/errors"])
    assert torch.equal(merged["x"], torch.ones(2)) and torch.equal(merged["opt"]["momentum"], torch.full((2,), 3.0))
    assert torch.equal(merged["outer"]["0"]["m"], torch.ones(1))  # keyed by fragment "0": shared
    assert set(merged["codec"]["error_feedback"]) == {"2"} and torch.equal(merged["codec"]["error_feedback"]["2"],
                                                                           torch.zeros(2))
    assert merged["codec"]["generators"] == {"2": own["codec"]["generators"]["2"]}
    # PowerSGD's Q keyed by tensor "0", as the peer replica 0's errors are: Q is the peer's, the
    # errors (not yet made by this worker) its own
    assert torch.equal(merged["codec"]["powersgd"]["q"]["0"], torch.ones(2))
    assert merged["codec"]["powersgd"]["errors"] == {}


def test_recovery_phases_are_read_back_from_the_step_records():
    from gradwire.report.recovery import phase_rows, report_blocks

    def rec(step, who, t, attempts=1, **extra):
        return {"step": step, "sim_time_s": t, "ft": {"participants": who, "attempts": attempts, "quorum_s": 0.01,
                                                      "skipped_samples": 8 * step} | extra}

    healed = {"from": 0, "at_step": 3, "bytes": 4096, "transfer_s": 0.02, "install_s": 0.001}
    steps = [rec(1, [0, 1, 2], 1.0), rec(2, [0, 1, 2], 1.1), rec(3, [0, 1], 2.6, attempts=2),
             rec(4, [0, 1], 2.7), rec(5, [0, 1, 2], 2.9, healed=healed), rec(6, [0, 1, 2], 3.0)]
    rows = phase_rows(steps)
    assert [(r["step"], r["change"], r["attempts"]) for r in rows] == [
        (3, "-2", 2), (5, "this replica rejoined (recovered from a peer)", 1)]
    survivor = [{**r, "ft": {k: v for k, v in r["ft"].items() if k != "healed"}} for r in steps]
    assert [(r["step"], r["change"]) for r in phase_rows(survivor)] == [(3, "-2"), (5, "+2")]
    assert rows[0]["step_s"] == pytest.approx(1.5) and rows[1]["transfer_bytes"] == 4096
    assert phase_rows(steps[4:])[0]["change"] == "this replica rejoined (recovered from a peer)"
    assert phase_rows([rec(1, [0, 1, 2], 1.0, attempts=3)])[0]["change"] == "start"  # waited for the others
    assert report_blocks([{"step": 1, "loss": 0.5}]) == []
    assert len(report_blocks(steps)[-1].rows) == 2


def test_a_quorums_rendezvous_is_named_by_its_members_and_step():
    """torchft names a rebuilt group's rendezvous by quorum number; a restarted Lighthouse numbers
    from 1 again, so gradwire adds the quorum's members (each with its process's uuid) and step:
    the same name on every member, another for another step or other members."""
    pytest.importorskip("torchft")
    from gradwire.transports.ft import rendezvous_tag

    a, b, c = "gradwire_0:u0", "gradwire_1:u1", "gradwire_2:u2"
    assert rendezvous_tag([a, b, c], 7) == rendezvous_tag([c, a, b], 7)  # every member: the same name
    assert rendezvous_tag([a, b, c], 7) != rendezvous_tag([a, b, c], 8)
    assert rendezvous_tag([a, b, c], 7) != rendezvous_tag([a, b, "gradwire_2:u9"], 7)  # a restarted process
    assert "/" not in rendezvous_tag([a, b], 0)  # one segment of torchft's store prefix


def server_side_tcp_state(server_port: int, client_port: int) -> str | None:
    """The kernel's state (hex, as /proc/net/tcp writes it; "01" established) of the loopback
    server's end of the connection from ``client_port``, or None once it is gone."""
    with open("/proc/net/tcp") as f:
        for line in f.read().splitlines()[1:]:
            local, remote, state = line.split()[1:4]
            if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
                return state
    return None


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="watches the server's socket in /proc/net/tcp")
def test_a_slow_reader_gets_a_whole_state_and_only_a_stalled_one_is_dropped():
    """The state server's timeout (2 s) bounds each chunk it writes, not the whole state: a peer
    that reads slowly but steadily gets every byte, in about four timeouts' worth of time (its
    sleeps make it so); a peer that stops reading is cut off once a write has waited a timeout (the
    server closes its end of the connection while the peer still reads nothing), and the server goes
    on serving the next request whole."""
    import io
    import socket
    import time
    import urllib.parse
    import urllib.request
    from datetime import timedelta

    from gradwire.fault.transfer import TRANSFER_CHUNK, SafeHTTPTransport

    # 2 s, not less: a state is also dropped a timeout after staging unless its fetch has begun, and
    # each 1 MiB write must finish within it while the reader pauses; a loaded machine (the suite's
    # workers on 2 cores) stalls threads for a good part of a second
    server = SafeHTTPTransport("127.0.0.1", timeout=timedelta(seconds=2.0))
    server.start()
    try:
        state = {"x": torch.arange(6 * 1024 * 1024, dtype=torch.float32)}  # 24 MiB: beyond the sockets' buffers
        server.send_checkpoint([1], 3, state, timedelta(seconds=5))
        whole = server.sent_bytes

        def fetch(pause_s: float) -> bytes:
            got = bytearray()
            with urllib.request.urlopen(f"{server.metadata()}3", timeout=5) as f:
                while chunk := f.read(TRANSFER_CHUNK):
                    got += chunk
                    time.sleep(pause_s)
            return bytes(got)

        got = fetch(0.3)  # about 3 MiB/s: the whole state takes about 3.5 timeouts to read
        assert len(got) == whole
        assert torch.equal(torch.load(io.BytesIO(got), weights_only=True)["x"], state["x"])

        # a reader that takes the first bytes and stalls: after 4 timeouts it finds the stream cut short
        # (the state staged again: the server drops it once fetched, and a timeout after staging)
        server.send_checkpoint([1, 2], 3, state, timedelta(seconds=5))
        address = urllib.parse.urlsplit(server.metadata())
        with socket.create_connection((address.hostname, address.port), timeout=5) as peer:
            peer.sendall(f"GET {address.path}3 HTTP/1.1\r\nHost: {address.hostname}\r\n\r\n".encode())
            received = len(peer.recv(1 << 16))
            # the peer reads nothing more until the server has given up on it and closed its end
            # (established -> FIN_WAIT1, or gone); draining before that would let the write finish
            client_port, deadline = peer.getsockname()[1], time.monotonic() + 60
            assert server_side_tcp_state(address.port, client_port) is not None  # (found: unread data keeps it)
            while server_side_tcp_state(address.port, client_port) == "01":
                assert time.monotonic() < deadline, "the server never dropped a peer that stopped reading"
                time.sleep(0.05)
            while chunk := peer.recv(1 << 20):  # what the buffers held, then the server's close
                received += len(chunk)
        assert 0 < received < whole, (received, whole)
        server.send_checkpoint([1], 3, state, timedelta(seconds=5))
        assert fetch(0.0) == got  # the server still serves the next peer whole
    finally:
        server.shutdown()


def test_the_state_server_drops_a_state_once_every_recipient_has_it_or_a_timeout_after_staging():
    """A source holds its serialised state only for the recipients the quorum named: dropped after
    the last one's fetch (a later request for it is refused, 404), or ``timeout`` after staging when
    one never comes; and a server that is never started (the Lighthouse unreachable) serves nothing."""
    import time
    import urllib.error
    from datetime import timedelta

    from gradwire.fault.transfer import SafeHTTPTransport

    # 5 s: the first fetch must begin within a timeout of the staging for the state to be held
    server = SafeHTTPTransport("127.0.0.1", timeout=timedelta(seconds=5))
    with pytest.raises(RuntimeError, match="has not been started"):
        server.metadata()
    server.start()
    try:
        state = {"x": torch.arange(1000, dtype=torch.float32)}
        server.send_checkpoint([1, 2], 4, state, timedelta(seconds=5))
        first = server.recv_checkpoint(0, server.metadata(), 4, timedelta(seconds=5))
        assert server._served is not None  # recipient 2 has not fetched yet
        second = server.recv_checkpoint(0, server.metadata(), 4, timedelta(seconds=5))
        assert torch.equal(first["x"], state["x"]) and torch.equal(second["x"], state["x"])
        assert server._served is None
        with pytest.raises(urllib.error.HTTPError, match="404"):  # (after the server's wait for a staging)
            server.recv_checkpoint(0, server.metadata(), 4, timedelta(seconds=30))
        server.send_checkpoint([1], 5, state, timedelta(seconds=5))  # its recipient never comes
        deadline = time.monotonic() + 60
        while server._served is not None:
            assert time.monotonic() < deadline, "the state was never dropped"
            time.sleep(0.05)
    finally:
        server.shutdown()


def test_a_state_transfer_is_bounded_as_a_whole_not_only_each_read():
    """A source that sends a byte every 20 ms never lets one socket read wait the 2 s timeout; the
    fetch still ends at timeout_s, with a TimeoutError."""
    import socket
    import threading
    import time
    from datetime import timedelta

    from gradwire.fault.transfer import SafeHTTPTransport

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle():
        conn, _ = listener.accept()
        with conn:
            conn.recv(1 << 16)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not stop.is_set():
                conn.sendall(b"x")
                time.sleep(0.02)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    recipient = SafeHTTPTransport("127.0.0.1", timeout=timedelta(seconds=2))
    try:
        with pytest.raises(TimeoutError, match=r"not complete within timeout_s=2 s"):
            recipient.recv_checkpoint(0, f"http://127.0.0.1:{listener.getsockname()[1]}/checkpoint/", 1,
                                      timedelta(seconds=2))
    finally:
        stop.set()
        thread.join(timeout=30)
        listener.close()
