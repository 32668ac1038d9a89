"""What both server-mode DiLoCos (backup-diloco, async-diloco: algorithms/outer_replicas.py) must
do alike: give the simulator's figures on the real driver with one replica, and resume bitwise."""

import pytest
import torch

from gradwire.run.loop import run
from tests.helpers import final_checkpoint, read_jsonl, states_equal

SPECS = ["backup-diloco:backups=0,inner_steps=2", "async-diloco:inner_steps=2"]


@pytest.mark.parametrize("spec, compressor", [(s, "none") for s in SPECS] + [
    ("backup-diloco:backups=0,inner_steps=2,answer=change", "sign:scaled=true"),
    ("async-diloco:inner_steps=2,answer=change", "chunked-topk:chunk=16,k=2")])
def test_simulator_and_real_driver_agree_with_one_replica(make_config, spec, compressor):
    base = make_config(algorithm=spec, workers=1, steps=6, eval_every=3, lr=0.01, stragglers="none:compute_s=0.001",
                       compressor=compressor)
    assert_simulator_equals_threads(base)


def assert_simulator_equals_threads(base) -> None:
    """``base`` on the simulator and on the threads backend's real driver: the same metrics."""
    sim = run(base.replace(out=base.out + "-sim"), progress=False)
    real = run(base.replace(out=base.out + "-threads", backend="threads", timeout_s=30), progress=False)
    assert sim["status"] == real["status"] == "finished"
    keys = ("step", "bytes_sent", "train_loss", "test_loss", "test_acc")
    a, b = read_jsonl(base.out + "-sim/metrics.jsonl"), read_jsonl(base.out + "-threads/metrics.jsonl")
    assert [{k: x[k] for k in keys} for x in a] == [{k: x[k] for k in keys} for x in b]


@pytest.mark.parametrize("spec", ["backup-diloco:backups=1,inner_steps=2",
                                  "backup-diloco:backups=1,late=buffer,inner_steps=2",
                                  "backup-diloco:backups=1,late=stale,inner_steps=2",
                                  "async-diloco:inner_steps=2,period=2",
                                  # compressed both ways: the server's copies of the replicas' θ resume too
                                  "backup-diloco:backups=1,inner_steps=2,answer=change|sign:scaled=true",
                                  "async-diloco:inner_steps=2,period=2,answer=change|randk:ratio=0.1"])
def test_resume_is_bitwise_exact(make_config, tmp_path, spec):
    """Stopped at step 7 (a checkpoint at 6, with messages in flight under the tail stragglers) and
    resumed: the same state and metrics as the run that never stopped."""
    spec, _, compressor = spec.partition("|")
    kw = dict(algorithm=spec, workers=3, steps=9, eval_every=3, lr=0.01, stragglers="tail:p=0.2,slowdown=10",
              checkpoint_every=3, compressor=compressor or "none")
    run(make_config(out="whole", **kw), progress=False)
    run(make_config(out="split", **kw | dict(steps=7)), progress=False)
    summary = run(make_config(out="split", resume=True, **kw), progress=False)
    assert summary["resumed"]
    assert states_equal(final_checkpoint(tmp_path / "whole")["state"], final_checkpoint(tmp_path / "split")["state"])

    def metrics(folder):
        return [{k: v for k, v in m.items() if not k.endswith("time_s")} for m in read_jsonl(folder / "metrics.jsonl")]

    assert metrics(tmp_path / "whole") == metrics(tmp_path / "split")
    steps = read_jsonl(tmp_path / "whole" / "steps.jsonl")
    if "buffer" in spec:  # the tail made someone late: buffered into a later round
        assert any(s["buffered"] for s in steps)
    elif "stale" in spec:  # the tail made someone late: applied with its staleness, none dropped
        assert any(s["late"] for s in steps) and not any(s["dropped"] for s in steps)
    elif spec.startswith("backup"):  # the tail made someone late: dropped
        assert any(s["dropped"] for s in steps)
    else:  # nobody is dropped; the tail shows as staleness
        assert max(s["staleness_max"] for s in steps) > max(s["staleness_mean"] for s in steps) > 0


@pytest.mark.parametrize("spec", ["backup-diloco:backups=1,inner_steps=2,answer=change",
                                  "async-diloco:inner_steps=2,answer=change"])
def test_compressed_answers_follow_ef21_p_and_cost_the_codecs_bytes(make_config, spec, monkeypatch):
    """answer=change: each answer to replica w is C(θ - w̃_w), w̃_w ← w̃_w + C(θ - w̃_w) (EF21-P,
    Gruntkowska et al. 2023), C the codec's encode then decode; a reference replays that rule on the
    θ each answer was made from, and the replica's copy equals it bitwise, as does the server's; each
    answer costs the header and the codec's payload, not θ's 32 bits a parameter."""
    from gradwire.algorithms.outer_replicas import ServerAnswers
    from gradwire.algorithms.protocol import HEADER_BYTES
    from gradwire.compress import build
    from gradwire.compress.base import Packet
    from gradwire.run.loop import Run
    from gradwire.transports.base import SERVER

    made, original = [], ServerAnswers.body

    def body(self, worker, whole=False):
        made.append((worker, whole, self.theta.clone()))
        return original(self, worker, whole)

    monkeypatch.setattr(ServerAnswers, "body", body)
    r = Run(make_config(algorithm=spec, workers=3, compressor="sign:scaled=true", stragglers="tail:p=0.3,slowdown=5"))
    received = []
    recv = r.transport.recv

    def recorded(nbytes, src, dst, **kw):
        if src == SERVER:
            received.append(nbytes)
        return recv(nbytes, src, dst, **kw)

    r.transport.recv = recorded
    for _ in range(6):
        r.train_step()
    codec = build("sign:scaled=true")
    start = Run(make_config(algorithm=spec, workers=3)).algorithm.theta  # every replica's first copy
    reference = {w: start.clone() for w in range(3)}
    for w, whole, theta in made:
        assert not whole
        change = theta - reference[w]
        reference[w] += codec.decode(Packet(codec.encode(change).buffer, change.shape, change.dtype))
    alg = r.algorithm
    answered = {w for w, _, _ in made}
    assert answered == {0, 1, 2} and len(made) >= 12
    for w in answered:  # the simulator applies an answer as it delivers it: every copy is up to date
        assert torch.equal(alg.answers.views[w], reference[w]) and torch.equal(alg.workers.held[w], reference[w])
    assert not torch.equal(reference[0], alg.theta)  # what the answers left out is still owed
    payload = codec.encode(torch.zeros_like(start)).buffer.numel()
    assert payload * 8 < start.numel() * 32 / 16 and set(received) == {HEADER_BYTES + payload}
