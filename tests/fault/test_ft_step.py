"""ReplicaDriver.step's loop against a scripted stand-in for torchft's Manager (one process, no
Lighthouse): a quorum too small for its step is asked again without computing or voting; a failed
attempt (a process group's rebuild that timed out) is retried from the step's starting state and
its error recorded; a vote whose own request timed out (the replica hung across it) is a failed
vote, retried, also against torchft's own Manager; max_retries failed votes in a row end the run
with one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("torchft")

from gradwire.errors import CommunicationError, ConfigError  # noqa: E402 - after the skip: fault/replica.py imports torchft
from gradwire.fault.replica import ReplicaDriver  # noqa: E402
from gradwire.tasks.oracle import WorkerData  # noqa: E402
from gradwire.transports.ft_spec import FaultTolerance  # noqa: E402


class ScriptedManager:
    """Each start_quorum takes the next quorum: its members, an error torchft would report (e.g. a
    failed gloo rebuild) and, optionally, a peer's state to heal from (torchft moves its step to the
    peer's, then calls the driver's ``recover`` inside start_quorum); members that are an exception
    make the quorum request itself fail with it (the Lighthouse unreachable: torchft's client
    raises). should_commit votes as torchft does for one replica group, counting the failed votes
    in a row that the next quorum request tells the Lighthouse (``told``); each entry of
    ``vote_errors`` is what the vote's own request raises at that call (None: it is answered), as
    torchft's client does when this process hung past the request's timeout."""

    def __init__(self, pg, quorums, vote_errors=()):
        self.pg, self.quorums, self.step = pg, list(quorums), 0
        self.votes: list[bool] = []
        self.vote_errors, self.told, self._commit_failures = list(vote_errors), [], 0
        self._min_replica_size, self._errored = 1, None
        self._client = SimpleNamespace(failed=None, vote_failed=None)  # (fault/replica.py's _QuorumSeen)
        self._quorum_future = None
        self.recover = None

    def start_quorum(self, timeout):
        self.told.append(self._commit_failures)
        members, self._errored, *heal = self.quorums.pop(0)
        if isinstance(members, Exception):
            self._client.failed = members
            raise members
        self.pg._global_ranks = members
        if heal:
            self.step = heal[0]["run"]["step"]
            self.recover(heal[0])

    def current_step(self):
        return self.step

    def errored(self):
        return self._errored

    def report_error(self, e):
        self._errored = e

    def should_commit(self, timeout):
        if self.vote_errors and (error := self.vote_errors.pop(0)) is not None:
            self._client.vote_failed = error
            raise error
        vote = self._errored is None and len(self.pg._global_ranks) >= self._min_replica_size
        self.votes.append(vote)
        self.step += vote
        self._commit_failures = 0 if vote else self._commit_failures + 1
        return vote


class CountingAlgorithm:
    def __init__(self):
        self.steps, self.state, self.fail_calls = 0, {"x": 0}, set()

    def step(self, ctx, step):
        self.steps += 1
        ctx.gradient(0, None)  # as sync reports it: a gradient of every worker of the run
        self.state = {"x": self.state["x"] + 1}
        if self.steps in self.fail_calls:  # a collective failed after the state had moved
            raise CommunicationError("allreduce: Connection closed by peer")
        return {"loss": 1.0, "gradients": ctx.world_size}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)

    def per_worker_state(self):
        return ()


class RunState:
    """The run's checkpointer as recover() uses it: what it installs goes to the algorithm and the
    data; a state whose algorithm part is not the algorithm's does not fit (ConfigError, as
    run/checkpointer.py says it)."""

    def __init__(self, algorithm, oracle):
        self.algorithm, self.oracle, self.installed = algorithm, oracle, None

    def load_state_dict(self, state):
        if "x" not in state["algorithm"]:
            raise ConfigError("checkpoint does not fit this run (its state has no 'x')")
        self.algorithm.load_state_dict(state["algorithm"])
        self.oracle.load_state_dict(state["data"])
        self.installed = state


def peer_state(step: int, algorithm=None) -> dict:
    """What replica 1 sends at ``step`` (fault/replica.py, ReplicaDriver.state_dict)."""
    run = {"step": step, "gradients": 3 * step, "window": [0.5], "algorithm": algorithm or {"x": step},
           "data": {"1": {"epoch": 0, "position": 8 * step}}, "clock": {"now": 1.0}, "gradient_counts": {},
           "transport": {"bytes_sent": 1000, "comm_time_s": 9.0}}
    return {"rank": "1", "run": run, "global": torch.zeros(1), "skipped_samples": 16}


def driver(quorums, vote_errors=(), **ft) -> tuple[ReplicaDriver, ScriptedManager, CountingAlgorithm]:
    algorithm = CountingAlgorithm()
    worker = WorkerData(torch.zeros(100, 1), torch.zeros(100), batch_size=8, seed=0, rank=0)
    oracle = SimpleNamespace(workers={0: worker}, state_dict=lambda: {"0": worker.state_dict()},
                             load_state_dict=lambda s: worker.load_state_dict(s["0"]))
    ctx = SimpleNamespace(timeline=SimpleNamespace(enabled=False), gradient_counts={}, oracle=oracle, world_size=3,
                          gradient=lambda rank, params: (1.0, None))
    transport = SimpleNamespace(rank=0, world_size=3, pg=SimpleNamespace(_global_ranks=None, reconfigured=False),
                                participants=[0], state_dict=dict, load_state_dict=lambda s: None,
                                state_bytes=0, exchange_bytes=0, comm_time_s=0.0)
    d = ReplicaDriver.__new__(ReplicaDriver)  # its state, without torchft's Manager and servers
    d.ctx, d.algorithm, d.transport = ctx, algorithm, transport
    d.counters = SimpleNamespace(step=0, window=[])
    d.state, d.setup = RunState(algorithm, oracle), lambda params: algorithm.load_state_dict({"x": 0})
    d.checkpoints = SimpleNamespace(last_received={"bytes": 1234, "seconds": 0.01})
    d.ft = FaultTolerance(**({"min_replicas": 2, "heartbeat_ms": 1, "quorum_timeout_s": 30.0} | ft))
    d.manager = ScriptedManager(transport.pg, quorums, vote_errors)
    d.manager.recover = d.recover
    d.samples, d.skipped_samples, d.events, d.healed, d.heals = [8, 8, 8], 0, [], None, 0
    d.full_at, d.leave_at, d.hold_at, d.marks, d.received_bytes, d.at_start = set(), None, {}, None, 0, None
    d.count_gradients()
    return d, d.manager, algorithm


def test_a_quorum_too_small_for_the_first_step_is_asked_again_without_computing_or_voting():
    d, manager, algorithm = driver([([0, 1], None), ([0, 1], None), ([0, 1, 2], None)])
    info = d.step()  # step 1 needs every replica (start_replicas=0)
    assert info["ft"] == {"participants": [0, 1, 2], "attempts": 3, "quorum_s": info["ft"]["quorum_s"],
                          "skipped_samples": 0, "state_bytes": 0, "exchange_bytes": 0}
    assert algorithm.steps == 1 and manager.votes == [True]  # no vote was cast against a small quorum
    d.manager.quorums = [([0, 1], None)]
    assert d.step()["ft"]["participants"] == [0, 1] and algorithm.steps == 2  # then min_replicas=2 suffices
    assert d.skipped_samples == 8


def test_failed_attempts_are_retried_from_the_steps_start_and_recorded():
    rebuild = RuntimeError("wait timeout after 10000ms, keys: /torchft/7/0/0/1")
    d, manager, algorithm = driver([([0, 1, 2], rebuild), ([0, 1, 2], None), ([0, 1, 2], None)])
    algorithm.fail_calls = {1}
    info = d.step()
    assert manager.votes == [False, False, True] and info["ft"]["attempts"] == 3
    assert info["ft"]["failures"] == [{"step": 1, "attempt": 1, "error": str(rebuild)},
                                      {"step": 1, "attempt": 2, "error": "allreduce: Connection closed by peer"}]
    assert algorithm.steps == 2 and algorithm.state == {"x": 1}  # the failed computation was undone
    manager.quorums.append(([0, 1], None))
    assert "failures" not in d.step()["ft"]  # a record holds its own step's failures only


def test_a_step_is_retried_max_retries_times_then_the_next_failed_vote_ends_the_run_with_one_line():
    """max_retries=2: a first attempt and two retries (torchft's meaning): two failed votes are
    retried, the third in a row ends the run."""
    rebuild = RuntimeError("connectFullMesh: connection refused")
    d, manager, algorithm = driver([([0, 1, 2], rebuild)] * 2 + [([0, 1, 2], None)], max_retries=2)
    assert d.step()["ft"]["attempts"] == 3 and manager.votes == [False, False, True]
    d, manager, algorithm = driver([([0, 1, 2], rebuild)] * 3, max_retries=2)
    with pytest.raises(CommunicationError, match=r"step 1 was not committed in 3 attempts \(the last failure: "
                                                 r"connectFullMesh: connection refused\)"):
        d.step()
    assert manager.votes == [False] * 3 and algorithm.steps == 0


def test_waiting_for_replicas_ends_after_quorum_timeout_s():
    d, manager, algorithm = driver([([0, 1], None)] * 1000, quorum_timeout_s=0.05, timeout_s=0.05)
    with pytest.raises(CommunicationError, match=r"step 1 needs 3 replicas; the quorum had \[0, 1\]"):
        d.step()
    assert manager.votes == [] and algorithm.steps == 0


def test_step_zeros_evaluation_waits_for_the_first_quorum():
    """At the job's start (the quorum's step is 0) step 0 is evaluated once, after the first quorum,
    with the run at step 0, and the step goes on in that quorum; a replica that joins a job under
    way (the quorum's step is past 0) skips it."""
    d, manager, algorithm = driver([([0, 1, 2], None)])
    seen = []
    d.at_start = lambda: seen.append((d.counters.step, len(manager.quorums), algorithm.steps))
    d.counters.step = 1  # (the run loop's train_step has moved it to the step under way)
    info = d.step()
    assert seen == [(0, 0, 0)]  # at step 0, after the first quorum, before any compute
    assert info["ft"]["attempts"] == 1 and info["ft"]["participants"] == [0, 1, 2]
    assert algorithm.steps == 1 and d.at_start is None and d.counters.step == 1
    late, manager, algorithm = driver([([0, 1, 2], None)])
    manager.step = 7  # the quorum's committed steps: this replica joins at step 8
    late.at_start = lambda: seen.append("evaluated")
    late.counters.step = 1
    assert late.step()["ft"]["participants"] == [0, 1, 2] and len(seen) == 1 and late.at_start is None


def test_a_steps_gradients_are_its_quorums_not_every_worker_of_the_run():
    """The algorithm reports a gradient for each of the run's 3 workers; a step of two replicas
    computed two, and the run's count (the sum of the steps') must say so."""
    d, manager, algorithm = driver([([0, 1, 2], None), ([0, 1], None), ([0, 1, 2], None), ([0, 1], None)])
    algorithm.fail_calls = {3}  # step 3's first attempt computes, then its collective fails
    assert d.step()["gradients"] == 3
    assert d.step()["gradients"] == 2
    assert d.step()["gradients"] == 2  # the failed attempt's computation is not counted (it was undone)
    assert algorithm.steps == 4 and manager.votes == [True, True, False, True]


def test_a_failed_quorum_request_is_asked_again_and_recorded():
    lost = RuntimeError('status: Cancelled, message: "Timeout expired"')
    d, manager, algorithm = driver([(lost, None), ([0, 1, 2], None)])
    d.counters.step = 1  # (the run loop's train_step has moved it to the step under way)
    info = d.step()
    assert info["ft"]["attempts"] == 2 and manager.votes == [True] and algorithm.steps == 1
    assert info["ft"]["failures"] == [{"step": 1, "quorum_error": str(lost)}]


def test_a_state_that_fails_to_install_ends_the_run_instead_of_a_retry_that_would_commit_on_it():
    """torchft installs a peer's state inside start_quorum, after moving its step to the peer's: a
    failure there asked again as a quorum error would leave the next quorum without a heal, and the
    replica would compute and commit on what was half installed."""
    wrong = peer_state(7, algorithm={"powersgd": {}})  # a peer of another configuration
    d, manager, algorithm = driver([([0, 1, 2], None, wrong), ([0, 1, 2], None)])
    with pytest.raises(ConfigError, match=r"replica 0: the state replica 1 sent at step 7 does not fit this run"):
        d.step()
    assert manager.votes == [] and algorithm.steps == 0


def test_a_heal_is_recorded_with_the_step_that_commits_after_a_failed_attempt():
    d, manager, algorithm = driver([([0, 1, 2], None, peer_state(7)), ([0, 1, 2], None)])
    algorithm.fail_calls = {1}  # the attempt that healed computes, then its collective fails
    info = d.step()
    assert manager.votes == [False, True] and info["ft"]["attempts"] == 2
    assert info["ft"]["healed"]["from"] == 1 and info["ft"]["healed"]["at_step"] == 7
    assert info["ft"]["healed"]["bytes"] == 1234 and d.received_bytes == 0  # (counted in the committed step)
    assert algorithm.state == {"x": 8} and d.counters.step == 8  # the retry started from the installed state
    assert d.skipped_samples == 16 and d.ctx.oracle.workers[0].position == 7 * 8  # a batch per committed step
    manager.quorums.append(([0, 1, 2], None))
    assert "healed" not in d.step()["ft"]  # the next step's record has none


# what torchft's client raised in a replica stopped (SIGSTOP) inside its commit vote, once woken
# (tests/fault/test_ft_replicas.py's hang test under load; the replica exited 1 on it)
VOTE_TIMEOUT = TimeoutError('status: Cancelled, message: "Timeout expired", details: [], metadata: MetadataMap '
                            '{ headers: {"date": "Sun, 29 Nov 2026 09:57:44 GMT"} }')


def test_a_vote_whose_request_timed_out_is_a_failed_vote_and_the_woken_replica_heals_in_the_retry():
    """A replica hung across its commit vote (stopped, or starved of the CPU, for longer than
    timeout_s): torchft's client raises when it runs again. The attempt is not committed, its
    state goes back, the Lighthouse is told of a failed vote (so the next quorum's group is built
    afresh), and the retry's quorum heals the replica, which the others have left behind."""
    d, manager, algorithm = driver([([0, 1, 2], None), ([0, 1, 2], None, peer_state(7))],
                                   vote_errors=[VOTE_TIMEOUT])
    d.counters.step = 1
    info = d.step()
    assert info["ft"]["attempts"] == 2 and manager.votes == [True] and manager.told == [0, 1]
    assert info["ft"]["failures"] == [{"step": 1, "attempt": 1, "error": str(VOTE_TIMEOUT)}]
    assert info["ft"]["healed"]["at_step"] == 7 and d.counters.step == 8
    assert algorithm.steps == 2 and algorithm.state == {"x": 8}  # the hung attempt's computation was undone
    assert manager._commit_failures == 0


def test_votes_whose_requests_time_out_count_towards_max_retries_and_other_vote_errors_end_the_run():
    d, manager, algorithm = driver([([0, 1, 2], None)] * 3, vote_errors=[VOTE_TIMEOUT] * 3, max_retries=2)
    with pytest.raises(CommunicationError, match=r"step 1 was not committed in 3 attempts \(the last failure: "
                                                 r"status: Cancelled, message: \"Timeout expired\""):
        d.step()
    assert manager.told == [0, 1, 2] and manager.votes == []
    d, manager, algorithm = driver([([0, 1, 2], None)] * 2)

    def fails_elsewhere(timeout):  # an error of should_commit that is not its request's
        raise RuntimeError("should_commit failed 11 times consecutively, exceeding max_retries=10")

    manager.should_commit = fails_elsewhere
    with pytest.raises(RuntimeError, match="exceeding max_retries"):  # not retried
        d.step()
    assert len(manager.quorums) == 1


@pytest.mark.parametrize("error, a_failed_vote", [(VOTE_TIMEOUT, True), (ConnectionError("transport error"), False)])
def test_only_the_vote_requests_deadline_is_recorded_as_a_failed_vote(error, a_failed_vote):
    """What the driver may retry is what torchft's client wrapper records: its request's deadline
    (TimeoutError); any other error of the request (the server gone) is raised as it is."""
    from gradwire.fault.replica import _QuorumSeen

    class Client:
        def should_commit(self, *args, **kwargs):
            raise error

    seen = _QuorumSeen(Client())
    with pytest.raises(type(error)):
        seen.should_commit(True, 1, timeout=None)
    assert (seen.vote_failed is error) == a_failed_vote


def test_a_vote_that_times_out_against_torchfts_own_manager_is_retried(tmp_path, data_dir):
    """The same with torchft's Manager, client and Lighthouse (one replica, in this process): its
    first vote goes to a torchft server that does not answer within timeout_s (a replica group of
    two whose other member never votes), so torchft's own client raises; the step is retried in a
    new quorum and committed, and the next step needs one attempt."""
    from datetime import timedelta

    from torchft._torchft import ManagerClient, ManagerServer
    from torchft.coordination import LighthouseServer

    from gradwire.config import RunConfig
    from gradwire.run.loop import Run

    lighthouse, elsewhere = (LighthouseServer(bind="127.0.0.1:0", min_replicas=1) for _ in range(2))
    port = lighthouse.address().rsplit(":", 1)[1].strip("/")
    # (heartbeating to a Lighthouse of its own: the replica's would wait for it to join its quorums)
    silent = ManagerServer(replica_id="silent", lighthouse_addr=elsewhere.address(), hostname="127.0.0.1",
                           bind="127.0.0.1:0", store_addr="127.0.0.1:1", world_size=2,
                           heartbeat_interval=timedelta(seconds=1), connect_timeout=timedelta(seconds=5),
                           quorum_retries=0)
    spec = f"torchft:min_replicas=1,start_replicas=1,timeout_s=1,lighthouse=127.0.0.1:{port},replica=0"
    run = Run(RunConfig(backend="torch", workers=3, task="synthetic-logreg", algorithm="sync", steps=4, batch_size=8,
                        out=str(tmp_path / "replica-0"), data_dir=str(data_dir), fault_tolerance=spec))
    seen = run.driver.replica.manager._client  # fault/replica.py's _QuorumSeen around torchft's client
    own, unanswered = seen._client, ManagerClient(silent.address(), connect_timeout=timedelta(seconds=5))

    class FirstVoteUnanswered:
        votes = 0

        def should_commit(self, *args, **kwargs):
            self.votes += 1
            return (unanswered if self.votes == 1 else own).should_commit(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(own, name)

    seen._client = FirstVoteUnanswered()
    try:
        first = run.train_step()
        assert isinstance(seen.vote_failed, TimeoutError) and seen._client.votes == 2
        assert first["ft"]["attempts"] == 2 and first["ft"]["participants"] == [0] and run.step == 1
        assert first["ft"]["failures"] == [{"step": 1, "attempt": 1, "error": str(seen.vote_failed).splitlines()[0]}]
        assert run.train_step()["ft"]["attempts"] == 1 and run.step == 2
    finally:
        run.transport.close()
        run.driver.replica.close()
        silent.shutdown()
        lighthouse.shutdown()
        elsewhere.shutdown()
