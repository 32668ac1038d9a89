"""Live state transfer between replicas: a torchft ``CheckpointTransport`` over HTTP that loads
with ``torch.load(..., weights_only=True)``.

torchft's own HTTP and process-group transports unpickle what a peer sends (``weights_only=False``);
gradwire never loads a pickle it did not write (docs/STYLE), so this one serves ``torch.save``
bytes of plain containers and tensors, which every gradwire ``state_dict`` is. A healthy replica
serialises its state once, when the quorum names it the source of a recovering peer
(``send_checkpoint``), and serves those bytes for that step until the next transfer replaces them
(a request that comes before the source has staged them waits, as torchft's own transport does):
a recipient may fetch after the source has moved on (a step without a collective does not hold
the source back). Each transfer's size and duration are recorded for the run's recovery figures.
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
        self.timeout = timeout
        self._staged = threading.Condition()  # a request for a step waits until the source stages it
        self._served: tuple[int, bytes] | None = None
        self.sent_bytes = 0
        self.last_received: dict | None = None  # {"bytes", "seconds", "step"} of the last fetch
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
                self.send_response(200)
                self.send_header("Content-Length", str(len(served[1])))
                self.end_headers()
                body = memoryview(served[1])
                for start in range(0, len(body), TRANSFER_CHUNK):  # the timeout bounds each chunk: a stalled
                    self.wfile.write(body[start:start + TRANSFER_CHUNK])  # peer is dropped, a slow one is not

            def log_message(self, *args):  # no line per request on stderr
                return

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="gradwire-state-server", daemon=True)
        self._thread.start()
        self._address = f"http://{host}:{self._server.server_address[1]}/checkpoint/"

    def metadata(self) -> str:
        return self._address

    def send_checkpoint(self, dst_ranks, step, state_dict, timeout) -> None:
        buffer = io.BytesIO()
        torch.save(state_dict, buffer)
        with self._staged:
            self._served = (step, buffer.getvalue())
            self._staged.notify_all()
        self.sent_bytes += len(self._served[1]) * len(dst_ranks)

    def recv_checkpoint(self, src_rank, metadata, step, timeout) -> dict:
        start = time.perf_counter()
        with urllib.request.urlopen(f"{metadata}{step}", timeout=timeout.total_seconds()) as f:
            staged = time.perf_counter()  # the answer's headers: the source has serialised its state
            data = f.read()
        read = time.perf_counter()
        state = torch.load(io.BytesIO(data), weights_only=True)
        self.last_received = {"bytes": len(data), "seconds": time.perf_counter() - start, "step": step,
                              "wait_source_s": staged - start, "wire_s": read - staged,
                              "load_s": time.perf_counter() - read}
        return state

    def shutdown(self, wait: bool = True) -> None:
        self._server.shutdown()
        self._server.server_close()
