"""What a recovering replica installs (fault/replica.py, ``ReplicaDriver.recover``), in one process:
two replicas of a torchft job (an in-process Lighthouse; no quorum is formed), the peer trained
alone for a few steps, its state handed to the other's ``recover`` as torchft would hand it. The
installed state is compared with what it must be: the peer's shared parts (parameters, momentum,
PowerSGD's Q and P, DiLoCo's outer state), this worker's own parts as a fresh setup makes them
(error-feedback residuals and PowerSGD's errors empty or zero, local models at the global one),
its data position where a worker that took part in every step would be, and its own per-process
figures (loss window, communication time). And every algorithm a replica can run declares exactly
its rank-keyed dicts per-worker (``Algorithm.per_worker_state``)."""

from __future__ import annotations

import copy

import pytest
import torch

from gradwire.config import RunConfig
from tests.backends.processes import free_port

pytest.importorskip("torchft")

BATCH, TRAINED = 8, 3  # the peer's committed steps when the other replica heals from it


@pytest.fixture
def lighthouse():
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
    yield server.address().rsplit(":", 1)[1].strip("/")
    server.shutdown()


@pytest.fixture
def replicas(tmp_path, data_dir, lighthouse):
    """``make(k, **run_flags)``: replica k of a 3-replica job, built as ``gradwire run`` builds it."""
    from gradwire.run.loop import Run

    made = []

    def make(k: int, **flags):
        spec = f"torchft:min_replicas=1,timeout_s=5,lighthouse=127.0.0.1:{lighthouse},replica={k}"
        cfg = RunConfig(**({"backend": "torch", "workers": 3, "task": "digits-logreg", "algorithm": "sync",
                            "steps": 20, "batch_size": BATCH, "out": str(tmp_path / f"replica-{k}"),
                            "data_dir": str(data_dir), "fault_tolerance": spec} | flags))
        made.append(Run(cfg))
        return made[-1]

    yield make
    for r in made:
        r.transport.close()
        r.driver.replica.close()


def train_alone(run, steps: int) -> None:
    """``steps`` committed steps of ``run``'s replica as the only participant (no collective runs)."""
    for step in range(1, steps + 1):
        run.step = run.oracle.step = step
        info = run.algorithm.step(run.ctx, step)
        run.window.append(info["loss"])
        run.transport.comm_time_s += 1.0  # (a figure of its own, not the recovering replica's)


def heal(run, peer) -> dict:
    """``run`` recovers from ``peer`` at the peer's step, as torchft's quorum call makes it."""
    replica = run.driver.replica
    replica.manager._step = peer.step  # torchft sets the quorum's step before it calls load_state_dict
    sent = copy.deepcopy(peer.driver.replica.state_dict())
    replica.recover(sent)
    return sent


def tensors_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("alternate", [False, True], ids=["q", "q-and-p"])
def test_powersgd_q_and_p_are_the_peers_and_its_errors_its_own(replicas, alternate):
    """digits-logreg has one matrix: PowerSGD's Q is keyed "0", as the peer replica 0's errors are."""
    compressor = "powersgd:rank=2" + (",alternate=true" if alternate else "")
    peer, healed = replicas(0, compressor=compressor), replicas(2, compressor=compressor)
    train_alone(peer, TRAINED)
    sent = heal(healed, peer)
    mine, theirs = healed.algorithm.state_dict()["codec"]["powersgd"], sent["run"]["algorithm"]["codec"]["powersgd"]
    assert list(theirs["q"]) == ["0"] and tensors_equal(mine["q"], theirs["q"])
    if alternate:
        assert list(theirs["p"]) == ["0"] and tensors_equal(mine["p"], theirs["p"])
    assert mine["step"] == theirs["step"] == TRAINED
    assert list(theirs["errors"]) == ["0"] and mine["errors"] == {}  # the peer's error memory is not taken


def test_error_feedback_resets_momentum_transfers_and_the_run_figures_are_its_own(replicas):
    flags = {"compressor": "topk:ratio=0.25", "error_feedback": True, "momentum": 0.9}
    peer, healed = replicas(0, **flags), replicas(2, **flags)
    fresh = copy.deepcopy(healed.algorithm.state_dict())
    train_alone(peer, TRAINED)
    healed.window.append(-1.0)  # a loss this replica computed itself (before it fell behind)
    sent = heal(healed, peer)
    mine, theirs = healed.algorithm.state_dict(), sent["run"]["algorithm"]
    assert float(theirs["codec"]["error_feedback"]["0"]["grad"].abs().max()) > 0  # there was a residual to take
    assert list(mine["codec"]["error_feedback"]) == ["2"]
    assert not any(e.any() for e in mine["codec"]["error_feedback"]["2"].values())  # reset: e_0 = 0
    assert torch.equal(mine["codec"]["generators"]["2"], fresh["codec"]["generators"]["2"])  # seeded by its rank
    assert float(theirs["opt"]["velocity"].abs().max()) > 0 and torch.equal(mine["opt"]["velocity"],
                                                                              theirs["opt"]["velocity"])
    assert torch.equal(mine["x"], theirs["x"])
    # its data where a worker that took part in every one of the peer's steps would be
    assert healed.oracle.state_dict() == {"2": {"epoch": 0, "position": TRAINED * BATCH}}
    assert healed.step == TRAINED and healed.gradients == sent["run"]["gradients"]
    assert healed.window == [-1.0]  # its own losses, none of the peer's
    assert healed.transport.comm_time_s == 0.0 and peer.transport.comm_time_s == TRAINED
    assert healed.transport.bytes_sent == sent["run"]["transport"]["bytes_sent"]  # the ledger: global
    assert healed.ctx.gradient_counts == {}  # (straggler draws are not made real here)


def test_dagc_error_feedback_is_reset_and_its_thresholds_the_peers(replicas):
    """DAGC keeps its residuals outside an averager (top-level ``error_feedback``, declared by
    DAGC itself): a healed worker takes none of the peer's, and the shared thresholds are the peer's."""
    flags = {"algorithm": "dagc", "error_feedback": True}
    peer, healed = replicas(0, **flags), replicas(2, **flags)
    train_alone(peer, TRAINED)
    sent = heal(healed, peer)
    mine, theirs = healed.algorithm.state_dict(), sent["run"]["algorithm"]
    assert list(theirs["error_feedback"]) == ["0"] and list(mine["error_feedback"]) == ["2"]
    assert any(float(t.abs().max()) > 0 for t in theirs["error_feedback"]["0"].values())  # a residual to take
    assert not any(t.any() for t in mine["error_feedback"]["2"].values())
    assert torch.equal(mine["thresholds"], theirs["thresholds"]) and torch.equal(mine["x"], theirs["x"])


def test_diloco_outer_state_is_the_peers_and_its_local_model_the_global_one(replicas):
    flags = {"algorithm": "diloco:inner_steps=2", "lr": 0.1}
    peer, healed = replicas(0, **flags), replicas(2, **flags)
    train_alone(peer, 2 * TRAINED)
    sent = heal(healed, peer)
    mine, theirs = healed.algorithm.state_dict(), sent["run"]["algorithm"]
    flat = torch.utils._pytree.tree_leaves
    assert any(float(torch.as_tensor(v).abs().max()) > 0 for v in flat(theirs["outer"]))  # momentum to take
    assert all(torch.equal(torch.as_tensor(u), torch.as_tensor(v))
               for u, v in zip(flat(mine["outer"]), flat(theirs["outer"]), strict=True))
    assert list(mine["replicas"]["x"]) == ["2"] and torch.equal(mine["replicas"]["x"]["2"], sent["global"])


# -- the declared per-worker parts are complete -------------------------------------------------
def _rank_keyed(state, workers: set[str], at: tuple = ()) -> set[tuple]:
    """The paths of the dicts in ``state`` keyed by exactly the workers' ranks."""
    found = set()
    if isinstance(state, dict):
        if set(map(str, state)) == workers:
            found.add(at)
        for key, value in state.items():
            found |= _rank_keyed(value, workers, (*at, str(key)))
    return found


def test_each_algorithm_a_replica_runs_declares_exactly_its_rank_keyed_dicts_per_worker(tmp_path, data_dir):
    """On the simulator every worker is local, so a per-worker dict holds the 3 ranks; digits-logreg
    has 2 tensors, so no dict keyed by tensor index looks like one. Each algorithm a replica can run
    (no server, no outer rounds in flight), and the compressors and options that keep per-worker
    memory; after 3 steps every per-worker dict is filled, so the declaration is checked both ways (--steps
    100: past every algorithm's first round, which a shorter run is refused before; only 3 are taken)."""
    from gradwire.algorithms import ALGORITHMS
    from gradwire.run.combination import check_combination
    from gradwire.run.loop import Run

    # dasgd:delay=0 for its snapshots: with a delay it keeps an average in flight, which is refused
    runs = [{"algorithm": name} for name in ALGORITHMS.names()] + [{"algorithm": "dasgd:delay=0"}]
    runs += [{"algorithm": "sync", "compressor": c, "error_feedback": ef} for c, ef in
             [("topk:ratio=0.25", True), ("powersgd:rank=2", False), ("powersgd:rank=2,alternate=true", False)]]
    runs += [{"algorithm": "dagc", "error_feedback": True}, {"algorithm": "signsgd:momentum=0"},
             {"algorithm": "local:eval=each"}, {"algorithm": "lsgd:eval=average"}, {"algorithm": "easgd:eval=average"},
             {"algorithm": "diloco", "compressor": "topk:ratio=0.25", "error_feedback": True}]
    checked = []
    for flags in runs:
        cfg = RunConfig(**({"backend": "sim", "workers": 3, "task": "digits-logreg", "steps": 100, "batch_size": 8,
                            "out": str(tmp_path / "run"), "data_dir": str(data_dir), "overwrite": True} | flags))
        combination = check_combination(cfg)
        algorithm = ALGORITHMS.build(combination.cfg.algorithm)
        if combination.needs_server or algorithm.carries_rounds:
            continue
        run = Run(cfg)
        for _ in range(3):
            run.train_step()
        found = {"/".join(p) for p in _rank_keyed(run.algorithm.state_dict(), {"0", "1", "2"})}
        declared = set(run.algorithm.per_worker_state())
        nested = {p for p in found if any(p.startswith(d + "/") for d in declared)}  # inside a declared one
        assert found - nested == declared, (flags, sorted(found - nested), sorted(declared))
        checked.append(flags)
    names = {f["algorithm"].split(":")[0] for f in checked}
    assert {"sync", "diloco", "local", "demo", "diana", "signsgd", "sparseloco", "dagc", "lsgd", "easgd"} <= names
    assert {"algorithm": "dagc", "error_feedback": True} in checked


def test_a_peer_of_another_configuration_is_refused_in_one_line_naming_it(replicas):
    from gradwire.errors import ConfigError

    peer = replicas(0, compressor="powersgd:rank=2")
    healed = replicas(2, compressor="topk:ratio=0.25", error_feedback=True)
    train_alone(peer, 1)
    with pytest.raises(ConfigError, match=r"^replica 2: the state replica 0 sent at step 1 does not fit this run") as e:
        heal(healed, peer)
    assert "\n" not in str(e.value)


# -- a Lighthouse that cannot be reached when a replica starts ----------------------------------
def _unreachable(tmp_path, data_dir, port: int, **ft) -> RunConfig:
    spec = ",".join(f"{k}={v}" for k, v in ({"min_replicas": 1, "timeout_s": 1, "quorum_timeout_s": 6,
                                              "lighthouse": f"127.0.0.1:{port}"} | ft).items())
    return RunConfig(backend="torch", workers=3, task="digits-logreg", steps=4, batch_size=BATCH,
                     out=str(tmp_path / "replica-0"), data_dir=str(data_dir), fault_tolerance=f"torchft:{spec}")


def _state_servers() -> int:
    import threading

    return sum(t.name == "gradwire-state-server" and t.is_alive() for t in threading.enumerate())


def test_an_unreachable_lighthouse_ends_the_start_in_one_line_and_leaves_no_state_server(tmp_path, data_dir,
                                                                                       monkeypatch):
    import torchft

    from gradwire.errors import CommunicationError
    from gradwire.run.loop import Run

    attempts, real = [], torchft.Manager
    monkeypatch.setattr(torchft, "Manager", lambda *a, **kw: attempts.append(1) or real(*a, **kw))
    port, servers = free_port(), _state_servers()
    with pytest.raises(CommunicationError) as e:
        Run(_unreachable(tmp_path, data_dir, port))
    assert str(e.value).startswith(f"replica 0: the Lighthouse at 127.0.0.1:{port} could not be reached within "
                                   "quorum_timeout_s=6 s: failed to connect") and "\n" not in str(e.value)
    assert len(attempts) >= 2  # asked again until quorum_timeout_s (each attempt waits timeout_s=1 s, or a
    # few on a loaded machine: 6 s leaves room for two)
    assert _state_servers() == servers


def test_a_lighthouse_that_comes_up_after_the_replica_is_waited_for(tmp_path, data_dir, monkeypatch):
    import torchft
    from torchft.coordination import LighthouseServer

    from gradwire.run.loop import Run

    port, started, real = free_port(), [], torchft.Manager

    def manager(*args, **kwargs):  # the first attempt finds no Lighthouse; then it starts
        try:
            return real(*args, **kwargs)
        except RuntimeError:
            started.append(LighthouseServer(bind=f"127.0.0.1:{port}", min_replicas=1))
            raise

    monkeypatch.setattr(torchft, "Manager", manager)
    run = Run(_unreachable(tmp_path, data_dir, port, quorum_timeout_s=60))
    try:
        assert len(started) == 1 and run.driver.replica.manager is not None
        assert run.driver.replica.checkpoints.metadata().startswith("http://127.0.0.1:")  # serving, once made
    finally:
        run.transport.close()
        started[0].shutdown()
    assert run.driver.replica.checkpoints._server is None  # closing the transport stopped the state server
