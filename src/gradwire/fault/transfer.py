"""Live state transfer between replicas: a torchft ``CheckpointTransport`` over HTTP that loads
with ``torch.load(..., weights_only=True)``.

torchft's own HTTP and process-group transports unpickle what a peer sends (``weights_only=False``);
gradwire never loads a pickle it did not write (docs/STYLE), so this one serves ``torch.save``
bytes of plain containers and tensors, which every gradwire ``state_dict`` is. A healthy replica
serialises its state once, when the quorum names it the source of a recovering peer
(``send_checkpoint``), and serves those bytes for that step (a request that comes before the source
has staged them waits, as torchft's own transport does): a recipient may fetch after the source
has moved on (a step without a collective does not hold the source back). The bytes are dropped
once every recipient has fetched them (their requests hold them until sent), or ``timeout`` after
they were staged (a recipient gives up
by then: its whole fetch is bounded by the same timeout), so a run does not hold a copy of its
state for the rest of its life. Each transfer's size and duration are recorded for the run's
recovery figures. The server starts with :meth:`start` (the replica driver starts it once
torchft's Manager is up, so a Lighthouse that cannot be reached leaves no server behind).
"""

from __future__ import annotations

import io
import threading
import time
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from torchft.checkpointing.transport import CheckpointTransport

TRANSFER_CHUNK = 1 << 20  # bytes a state is served in: each write must finish within the timeout


class SafeHTTPTransport(CheckpointTransport[dict]):
    def __init__(self, host: str, timeout: timedelta):
        self.host, self.timeout = host, timeout
        self._staged = threading.Condition()  # a request for a step waits until the source stages it
        self._served: tuple[int, bytes] | None = None
        self._fetches_left = 0  # recipients of the staged bytes that have not fetched them all yet
        self._drop_timer: threading.Timer | None = None
        self.sent_bytes = 0
        self.last_received: dict | None = None  # {"bytes", "seconds", "step"} of the last fetch
        self._server = self._thread = self._address = None

    def start(self) -> None:
        """Start serving (a thread of its own, on a free port of ``host``)."""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            timeout = owner.timeout.total_seconds()  # per socket call: a peer that stalls frees its thread

            def do_GET(self):  # /checkpoint/<step>: waits (up to the timeout) until that step is staged
                parts = self.path.strip("/").split("/")
                step = int(parts[1]) if len(parts) == 2 and parts[0] == "checkpoint" and parts[1].isdigit() else -1
                with owner._staged:
                    owner._staged.wait_for(lambda: owner._served is not None and owner._served[0] >= step,
                                           timeout=owner.timeout.total_seconds())
                    served = owner._served
                if served is None or served[0] != step:
                    self.send_error(404, f"no state for {self.path}")
                    return
                owner._fetched(served)  # (this request holds the bytes it sends until it is done)
                self.send_response(200)
                self.send_header("Content-Length", str(len(served[1])))
                self.end_headers()
                body = memoryview(served[1])
                for start in range(0, len(body), TRANSFER_CHUNK):  # the timeout bounds each chunk: a stalled
                    self.wfile.write(body[start:start + TRANSFER_CHUNK])  # peer is dropped, a slow one is not

            def log_message(self, *args):  # no line per request on stderr
                return

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="gradwire-state-server", daemon=True)
        self._thread.start()
        self._address = f"http://{self.host}:{self._server.server_address[1]}/checkpoint/"

    def metadata(self) -> str:
        if self._address is None:
            raise RuntimeError("the state server has not been started (SafeHTTPTransport.start)")
        return self._address

    def send_checkpoint(self, dst_ranks, step, state_dict, timeout) -> None:
        buffer = io.BytesIO()
        torch.save(state_dict, buffer)
        served = (step, buffer.getvalue())
        with self._staged:
            self._served, self._fetches_left = served, len(dst_ranks)
            self._staged.notify_all()
            if self._drop_timer is not None:
                self._drop_timer.cancel()
            self._drop_timer = threading.Timer(self.timeout.total_seconds(), self._drop, args=(served,))
            self._drop_timer.daemon = True
            self._drop_timer.start()
        self.sent_bytes += len(served[1]) * len(dst_ranks)

    def _fetched(self, served: tuple) -> None:
        """A recipient's fetch of the staged bytes has begun: once every recipient's has, the server
        no longer holds them (each request holds them until its own transfer ends)."""
        with self._staged:
            if self._served is served:
                self._fetches_left -= 1
                if self._fetches_left <= 0:
                    self._served = None

    def _drop(self, served: tuple) -> None:
        """``timeout`` after staging: every recipient has fetched or given up."""
        with self._staged:
            if self._served is served:
                self._served = None

    def recv_checkpoint(self, src_rank, metadata, step, timeout) -> dict:
        """The source's state for ``step``; TimeoutError when the whole fetch (the wait for the
        source to serialise it included) takes longer than ``timeout``."""
        start = time.perf_counter()
        deadline = time.monotonic() + timeout.total_seconds()
        chunks = []
        with urllib.request.urlopen(f"{metadata}{step}", timeout=timeout.total_seconds()) as f:
            staged = time.perf_counter()  # the answer's headers: the source has serialised its state
            while chunk := f.read1(TRANSFER_CHUNK):  # each read is bounded by the socket's timeout, the sum here
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"state transfer from {metadata}{step}: not complete within "
                                       f"timeout_s={timeout.total_seconds():g} s ({sum(map(len, chunks))} bytes read)")
        data = b"".join(chunks)
        read = time.perf_counter()
        state = torch.load(io.BytesIO(data), weights_only=True)
        self.last_received = {"bytes": len(data), "seconds": time.perf_counter() - start, "step": step,
                              "wait_source_s": staged - start, "wire_s": read - staged,
                              "load_s": time.perf_counter() - read}
        return state

    def shutdown(self, wait: bool = True) -> None:
        with self._staged:
            self._served = None
            if self._drop_timer is not None:
                self._drop_timer.cancel()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
