"""The torch backend's non-blocking all-gather really travels before anyone waits for it: rank 1
joins the collective only after rank 0's ``allgather_start`` has returned, and rank 0 sees the
collective complete while it has not called ``wait()`` (a start that blocked would deadlock until
the timeout; one that sent nothing until ``wait()`` would never complete). Payloads of different
sizes (no ``size=``: exchanged first) come back cut to each rank's own length."""

import os
import subprocess
import sys

import pytest

from tests.backends.processes import finished, free_port

SCRIPT = r"""
import sys, time, torch
import torch.distributed as dist
from gradwire.transports.torch_dist import TorchTransport

t = TorchTransport(timeout_s=20.0)
store = dist.distributed_c10d._get_default_store()
r = t.rank
fixed = torch.full((100,), r, dtype=torch.uint8)
if r == 1:
    store.wait(["rank0-started"])  # rank 1 joins only once rank 0's start has returned
h = t.allgather_start({r: fixed}, size=100)
if r == 0:
    store.set("rank0-started", "1")
    deadline = time.perf_counter() + 15
    while not h.work.is_completed():  # completes while rank 0 "computes", before any wait()
        if time.perf_counter() > deadline:
            sys.exit("the all-gather did not complete before wait() was called")
        time.sleep(0.01)
out = h.wait()
assert [out[k].tolist() for k in (0, 1)] == [[0] * 100, [1] * 100], out
assert t.bytes_sent == 200, t.bytes_sent  # (W - 1) W m, as the blocking all-gather counts
mine = torch.full((50 + 7 * r,), 10 + r, dtype=torch.uint8)  # no size=: the sizes travel first
out = t.allgather_start({r: mine}).wait()
assert [out[k].tolist() for k in (0, 1)] == [[10] * 50, [11] * 57], out
# the sizes' exchange, (W - 1) W 8, then the payloads padded to the longest, (W - 1) W 57
assert t.bytes_sent == 200 + 16 + 114, t.bytes_sent
out = t.allgather({r: mine})  # the blocking form counts the same
assert [out[k].tolist() for k in (0, 1)] == [[10] * 50, [11] * 57] and t.bytes_sent == 330 + 130, t.bytes_sent
t.close()
"""


@pytest.mark.timeout(120)
def test_allgather_start_travels_before_wait_and_cuts_each_payload(tmp_path):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for r in range(2)]
    results = finished(procs, timeout=90)
    assert [code for code, _ in results] == [0, 0], [(code, err[-2000:]) for code, err in results]


BROADCAST = r"""
import torch
from gradwire.transports.torch_dist import TorchTransport

t = TorchTransport(timeout_s=20.0)
try:  # gloo would abort the receivers (no Python error): the source refuses first, naming both sizes
    t.broadcast(torch.zeros(10, dtype=torch.uint8), 0, size=8)
except ValueError as e:
    assert "broadcast of 10 bytes announced as 8 bytes" in str(e), e
else:
    raise SystemExit("a broadcast of another size than announced was sent")
assert t.bytes_sent == 0
t.close()
"""


@pytest.mark.timeout(120)
def test_a_broadcast_of_another_size_than_announced_is_refused_at_the_source():
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    (code, err), = finished([subprocess.Popen([sys.executable, "-c", BROADCAST], stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True, env=env)], timeout=90)
    assert code == 0, err[-2000:]
