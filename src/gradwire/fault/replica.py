"""One replica's steps under torchft: a quorum per step, a vote on committing it, live recovery.

Every gradwire step of a ``--fault-tolerance torchft`` run goes through :meth:`ReplicaDriver.step`:

1. ``Manager.start_quorum`` asks the Lighthouse for the step's quorum (synchronously: a recovering
   replica is healed before it computes, so it takes part in the very step it joins) and, when
   the membership changed, rebuilds the gloo process group (torchft's ``ProcessGroupGloo``);
2. the algorithm's step runs with the quorum's workers as participants (transports/ft.py); a
   collective that fails is reported to the Manager instead of raising;
3. ``Manager.should_commit`` decides: committed, the step stands; not committed (a peer died
   mid-step, fewer than ``min_replicas`` took part, or the vote's own request timed out: this
   process was stopped or starved across it), every piece of state goes back to where the step
   began and the step is tried again with a new quorum.

A replica whose committed step count is behind the quorum's (a restarted process, a new one, one
that failed to commit) is healed by torchft: a peer at the quorum's step sends its state through
the checkpoint transport (fault/transfer.py) and :meth:`recover` installs it. Sync SGD's steps
all communicate, so its quorum is per step; local SGD and (Streaming) DiLoCo take a quorum at
every step too, and those without a collective cost one Lighthouse round trip and commit at once.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Iterable
from datetime import timedelta

from gradwire.errors import CommunicationError, ConfigError
from gradwire.fault.transfer import SafeHTTPTransport
from gradwire.report.timeline import COMM, WAIT
from gradwire.transports.ft import FtTransport, rendezvous_tag


def scripted_steps(variable: str, form: str, *, fields: int = 1, last_is_text: bool = False) -> list:
    """The comma-separated entries of a fault-scripting variable (``fields`` 1: the step numbers;
    more: each entry split on ``:`` into that many fields, numbers but for a last text field); a
    malformed value is a ConfigError naming the variable and its form."""
    raw = os.environ.get(variable, "")
    entries = [e.strip() for e in raw.split(",") if e.strip()]
    parsed = [e if fields == 1 else e.split(":", fields - 1) for e in entries]
    for entry in parsed:
        numbers = [entry] if fields == 1 else entry[:-1] if last_is_text else entry
        if ((fields > 1 and len(entry) != fields) or not all(x.isascii() and x.isdigit() for x in numbers)
                or (last_is_text and not entry[-1])):
            raise ConfigError(f"{variable}={raw!r} must be {form}")
    return parsed


class _QuorumSeen:
    """torchft's ``ManagerClient``, keeping the last quorum it answered (its members and step name
    the quorum's gloo rendezvous: transports/ft.py, ``rendezvous_tag``), the last error of a
    quorum request (``failed``: the only error of ``Manager.start_quorum`` that is asked again)
    and the last error of a commit vote's request (``vote_failed``: the only error of
    ``Manager.should_commit`` that is a failed vote rather than the end of the run)."""

    def __init__(self, client):
        self._client, self.last, self.failed, self.vote_failed = client, None, None, None

    def _quorum(self, *args, **kwargs):
        try:
            self.last = self._client._quorum(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - torchft reports an unreachable Lighthouse as several types
            self.failed = e
            raise
        return self.last

    def should_commit(self, *args, **kwargs):
        try:
            return self._client.should_commit(*args, **kwargs)
        except TimeoutError as e:  # the request's own deadline passed (this process stopped or starved across it)
            self.vote_failed = e
            raise

    def __getattr__(self, name):
        return getattr(self._client, name)


def merge_own(peer, own, per_worker: Iterable[str]):
    """``peer``'s state with the dicts at the paths ``per_worker`` (``a/b``: the algorithm's
    ``per_worker_state()``) taken from ``own``: the shared parts (parameters, optimizer moments,
    PowerSGD's Q and P, the outer optimizer) are the peer's, each worker's own memory is this worker's."""
    return _merge(peer, own, frozenset(tuple(path.split("/")) for path in per_worker), ())


def _merge(peer, own, paths: frozenset[tuple[str, ...]], at: tuple[str, ...]):
    if not isinstance(peer, dict):
        return peer
    own = own if isinstance(own, dict) else {}
    merged = {}
    for key, value in peer.items():
        path = (*at, str(key))
        merged[key] = own.get(key, {}) if path in paths else _merge(value, own.get(key), paths, path)
    return merged


class ReplicaDriver:
    """Drives one replica's steps on an :class:`FtTransport`: ``ctx`` and ``algorithm`` as every
    driver has them (servers/driver.py), ``state`` the run's checkpointer (its ``state_dict`` and
    ``load_state_dict``: what a peer sends, what a recovering replica installs), ``counters`` the
    run's (its ``step`` is the committed steps + 1), ``setup(params)`` sets the algorithm up afresh
    at ``params`` and ``samples`` holds each worker's samples per step."""

    def __init__(self, ctx, algorithm, transport: FtTransport, *, state, counters, setup, samples: list[int]):
        from torchft import Manager

        # when this process reached each point of its start (epoch seconds; the first committed
        # step's record has them as ``ft.startup``: benchmarks/ft_recovery.py breaks a rejoin down)
        self.marks: dict[str, float] | None = {"driver": time.time()}
        self.ctx, self.algorithm, self.transport, self.ft = ctx, algorithm, transport, transport.ft
        self.state, self.counters, self.setup, self.samples = state, counters, setup, samples
        ft = self.ft
        self.skipped_samples = 0     # samples of the shards of replicas absent from committed steps
        self.events: list[dict] = []  # this step's failed attempts and quorum requests (in its steps.jsonl record)
        self.healed: dict | None = None  # the heal of the step under way (kept through its retries)
        self.heals = 0  # the states installed from a peer
        self.checkpoints = SafeHTTPTransport(ft.host, timedelta(seconds=ft.timeout_s))
        # torchft's Manager connects to the Lighthouse as it is made (RuntimeError when it cannot
        # within connect_timeout): a Lighthouse that starts after the replicas, or restarts, is
        # waited for up to quorum_timeout_s, as a quorum would be
        deadline = time.monotonic() + ft.quorum_timeout_s
        while True:
            try:
                self.manager = Manager(
                    pg=transport.pg, load_state_dict=self.recover, state_dict=self.state_dict,
                    min_replica_size=ft.min_replicas, use_async_quorum=False,
                    timeout=timedelta(seconds=ft.timeout_s), quorum_timeout=timedelta(seconds=ft.quorum_timeout_s),
                    connect_timeout=timedelta(seconds=ft.timeout_s), rank=0, world_size=1,
                    store_addr=ft.host, store_port=transport.store.port, lighthouse_addr=ft.lighthouse_url,
                    replica_id=f"gradwire_{ft.replica}", hostname=ft.host,
                    heartbeat_interval=timedelta(milliseconds=ft.heartbeat_ms),
                    checkpoint_transport=self.checkpoints, init_sync=False, max_retries=None)  # retries: step()
                break
            except RuntimeError as e:
                if time.monotonic() >= deadline:
                    raise CommunicationError(f"replica {ft.replica}: the Lighthouse at {ft.lighthouse} could not be "
                                             f"reached within quorum_timeout_s={ft.quorum_timeout_s:g} s: "
                                             f"{str(e).splitlines()[0][:160]}") from None
                time.sleep(ft.heartbeat_ms / 1000)
        self.checkpoints.start()  # (after the Manager: a replica that cannot reach the Lighthouse leaves no server)
        transport.manager, transport.closing = self.manager, self.close
        # torchft asks for a quorum, then configures the group with it: the group's rendezvous is
        # named by that quorum's members and step as well as its number (Manager._client: private)
        seen = self.manager._client = _QuorumSeen(self.manager._client)
        transport.pg.tag = lambda: rendezvous_tag(seen.last.replica_ids, seen.last.max_step)
        self.received_bytes = 0  # fetched from a peer, not yet in a committed step's ledger
        self.count_gradients()
        self.at_start = None  # the run's step-0 evaluation, until the first quorum (run/drivers.py)
        # fault scripting for tests and benchmarks (fault/harness.py): GRADWIRE_FT_FULL_AT=S1,S2 makes
        # steps S1, S2 commit only with every replica (they wait for one that is away);
        # GRADWIRE_FT_LEAVE_AT=K:S makes replica K leave cleanly after committing step S
        full = scripted_steps("GRADWIRE_FT_FULL_AT", "S1,S2,...")
        self.full_at = {int(x) for x in full}
        leave = {int(k): int(s) for k, s in scripted_steps("GRADWIRE_FT_LEAVE_AT", "REPLICA:STEP[,REPLICA:STEP]",
                                                           fields=2)}
        self.leave_at = leave.get(ft.replica)
        # GRADWIRE_FT_HOLD_AT=S:FILE[,S:FILE] makes a replica that committed step S (and recorded it)
        # wait before step S+1 until FILE exists (at most quorum_timeout_s): a test changes the
        # network between two steps
        holds = scripted_steps("GRADWIRE_FT_HOLD_AT", "STEP:FILE[,STEP:FILE]", fields=2, last_is_text=True)
        self.hold_at = {int(step): path for step, path in holds}
        self.marks["manager"] = time.time()

    def count_gradients(self) -> None:
        """Count the gradients this replica computes (``own_gradients``; every gradient goes through
        ``ctx.gradient``). The algorithms report a step's gradients for every worker of the run
        (``ctx.world_size``); a step of a quorum has only its participants' (:meth:`step`)."""
        self.own_gradients = 0
        compute = self.ctx.gradient

        def counted(*args, **kwargs):
            self.own_gradients += 1
            return compute(*args, **kwargs)

        self.ctx.gradient = counted

    # -- what a healthy replica sends, and what a recovering one makes of it ---------------------
    def state_dict(self) -> dict:
        return {"rank": str(self.transport.rank), "run": self.state.state_dict(),
                "global": self.algorithm.eval_params().clone(), "skipped_samples": self.skipped_samples}

    def recover(self, state: dict) -> None:
        """Install a peer's state: the shared parts are the peer's; this worker's own parts are
        what the algorithm's setup gives at the transferred parameters (error-feedback residuals
        and PowerSGD's error memories reset, local replicas at the global model: ``merge_own``);
        its data shard continues where a worker that took part in every step would be (the steps it
        missed: skipped, counted by every replica in ``skipped_samples``). The run's per-process
        figures stay this process's own: its loss window (the losses it computed since the last
        evaluation), its communication time, and its gradient count for straggler draws (set, like
        its data position, to a worker's that took part in every step)."""
        rank, oracle, counters = self.transport.rank, self.ctx.oracle, self.counters
        start = time.perf_counter()
        own_window, own_comm_s = list(counters.window), self.transport.comm_time_s
        self.setup(state["global"].clone())
        own_algorithm = copy.deepcopy(self.algorithm.state_dict())
        peer = state["run"]
        committed = self.manager.current_step()  # the quorum's step, set by torchft before this call
        worker = oracle.workers[rank]
        worker.load_state_dict({"epoch": 0, "position": 0})
        for _ in range(committed):  # the batches of the steps this shard took part in, or skipped
            worker.next_batch()
        per_worker = self.algorithm.per_worker_state()
        merged = peer | {
            "step": committed, "algorithm": merge_own(peer["algorithm"], own_algorithm, per_worker),
            "data": oracle.state_dict(), "window": own_window,
            # counted only where straggler draws are made real (the peer's holds its own rank then)
            "gradient_counts": {str(rank): committed} if peer["gradient_counts"] else {},
            "transport": peer["transport"] | {"comm_time_s": own_comm_s}}
        try:
            self.state.load_state_dict(merged)
        except ConfigError as e:  # (the peer runs another configuration: no retry can fix it)
            raise ConfigError(f"replica {rank}: the state replica {state['rank']} sent at step {committed} does not "
                              f"fit this run ({e}); every replica must run the same configuration") from None
        self.skipped_samples = int(state["skipped_samples"])
        self.heals += 1
        received = self.checkpoints.last_received or {}
        self.received_bytes += received.get("bytes", 0)
        self.healed = {"from": int(state["rank"]), "at_step": committed, "bytes": received.get("bytes", 0),
                       "transfer_s": received.get("seconds", 0.0), "install_s": time.perf_counter() - start}
        # the fetch's parts: waiting for the source to serialise, the bytes on the wire, torch.load
        self.healed |= {k: received[k] for k in ("wait_source_s", "wire_s", "load_s") if k in received}

    def _record_quorum(self, began: float, seconds: float, healed: dict | None) -> None:
        """The quorum call on the run's timeline: a WAIT, less the state transfer inside it (``healed``:
        the heal of this call), a COMM with its bytes (report/recovery.py)."""
        timeline, rank = self.ctx.timeline, self.transport.rank
        if not timeline.enabled:
            return
        transfer = healed["transfer_s"] if healed is not None else 0.0
        timeline.add(rank, WAIT, began, began + seconds - transfer)
        if healed is not None:
            timeline.add(rank, COMM, began + seconds - transfer, began + seconds, nbytes=healed["bytes"])

    def _snapshot(self) -> dict:
        return copy.deepcopy({"algorithm": self.algorithm.state_dict(), "data": self.ctx.oracle.state_dict(),
                              "transport": self.transport.state_dict(),
                              "gradient_counts": dict(self.ctx.gradient_counts)})

    def _restore(self, snap: dict) -> None:
        self.algorithm.load_state_dict(copy.deepcopy(snap["algorithm"]))
        self.ctx.oracle.load_state_dict(snap["data"])
        self.transport.load_state_dict(snap["transport"])
        self.ctx.gradient_counts = dict(snap["gradient_counts"])

    # -- one step --------------------------------------------------------------------------------
    def _required(self) -> int:
        """How many replicas the quorum's step needs to commit: all ``--workers`` for the run's
        first step (``start_replicas`` of them, every replica by default), so that a replica that
        starts a little late (imports, data) is not left behind from step 1, and for the scripted
        steps of ``GRADWIRE_FT_FULL_AT``; ``min_replicas`` otherwise. Read after the quorum, when
        every member is at the quorum's step (a healed one has jumped to it), so that all members
        agree. torchft's commit threshold is set to it (``Manager._min_replica_size``, which
        ``should_commit`` compares with the quorum's size)."""
        step = self.manager.current_step()
        if step == 0:
            need = self.ft.start_replicas or self.transport.world_size
        else:
            need = self.transport.world_size if step + 1 in self.full_at else self.ft.min_replicas
        self.manager._min_replica_size = max(need, self.ft.min_replicas)
        return self.manager._min_replica_size

    def step(self) -> dict:
        """One committed step (retried until committed); sets ``counters.step`` to its number."""
        manager, counters, ctx = self.manager, self.counters, self.ctx
        if counters.step - 1 in self.hold_at:  # (counters.step: the step about to be taken)
            self._hold(self.hold_at.pop(counters.step - 1))
        if self.marks is not None and "first_step" not in self.marks:
            self.marks["first_step"] = time.time()
        snap = self._snapshot()
        # how long this step may wait for the replicas it needs, and (from the last quorum) for the
        # Lighthouse to answer: quorum_timeout_s each
        wait_deadline = quorum_deadline = time.monotonic() + self.ft.quorum_timeout_s
        attempt = failures = 0
        self.healed = None  # (an attempt that heals sets it; it stays with the step until it commits)
        while True:
            attempt += 1
            heals = self.heals
            t0, began = time.perf_counter(), ctx.timeline.now() if ctx.timeline.enabled else 0.0
            if not self._quorum(quorum_deadline):
                continue
            healed_now = self.heals != heals
            quorum_deadline = time.monotonic() + self.ft.quorum_timeout_s
            quorum_s = time.perf_counter() - t0
            self._mark("quorum", t0)
            if self.at_start is not None:
                evaluate, self.at_start = self.at_start, None
                if manager.current_step() == 0 and not healed_now:
                    # the job's start: step 0 is evaluated as in every run, and the step goes on in
                    # this quorum (the others wait in its first collective, for at most timeout_s:
                    # past that the attempt fails and is retried). Asking for the quorum again
                    # instead would leave the members that evaluated at an earlier quorum waiting
                    # in a collective for one that waits in the quorum. A replica joining later
                    # skips it (its state is a peer's; its first evaluation is the others' next)
                    counters.step = 0
                    evaluate()
            self._record_quorum(began, quorum_s, self.healed if healed_now else None)
            if healed_now:
                snap = self._snapshot()  # a retry starts from the transferred state
            counters.step = manager.current_step() + 1  # committed steps + 1 (a healed replica jumps ahead)
            ctx.oracle.step = ctx.timeline.step = counters.step
            ranks = self.transport.pg._global_ranks or [self.transport.rank]
            self.transport.participants = list(ranks)
            need = self._required()
            if len(ranks) < need and manager.errored() is None:
                # a quorum too small to commit (replicas still starting or away): every member knows
                # it, so none computes or votes, and the same members' next quorum keeps its id (a
                # failed vote would make the Lighthouse renumber it, and torchft rebuild the gloo
                # group at every attempt, which on a loaded machine races with the rebuild itself)
                if time.monotonic() >= wait_deadline:
                    raise CommunicationError(f"replica {self.transport.rank}: step {counters.step} needs {need} "
                                             f"replicas; the quorum had {sorted(ranks)} for quorum_timeout_s="
                                             f"{self.ft.quorum_timeout_s:g} s")
                time.sleep(self.ft.heartbeat_ms / 1000)  # let the others heartbeat and ask again
                continue
            info = None
            if manager.errored() is None and self.transport.pg.reconfigured:
                # a new group: every member adds up the state its members fetched (the ledger)
                self.transport.count_state_transfer(self.received_bytes)
            computed = self.own_gradients
            if manager.errored() is None:
                try:
                    info = self.algorithm.step(ctx, counters.step)
                except CommunicationError as e:
                    manager.report_error(e)
            failed = manager.errored()
            self._mark("computed")
            committed, vote_error = self._vote()
            failed = failed or vote_error
            if committed:
                self.skipped_samples += sum(s for r, s in enumerate(self.samples) if r not in ranks)
                self.transport.pg.reconfigured, self.received_bytes = False, 0
                ft = {"participants": sorted(ranks), "attempts": attempt, "quorum_s": round(quorum_s, 6),
                      "skipped_samples": self.skipped_samples, "state_bytes": self.transport.state_bytes,
                      "exchange_bytes": self.transport.exchange_bytes}
                if self.healed is not None:
                    ft["healed"] = self.healed
                if self.marks is not None:  # this process's first committed step
                    self._mark("committed")
                    ft["startup"], self.marks = {k: round(v, 4) for k, v in self.marks.items()}, None
                if self.events:  # why earlier attempts of this step failed
                    ft["failures"], self.events = self.events, []
                if self.leave_at == counters.step:
                    self.leave()
                if "gradients" in info:  # the quorum's: every participant computes as many as this one
                    info["gradients"] = (self.own_gradients - computed) * len(ranks)
                return info | {"ft": ft}
            # not committed: a collective, the process group's rebuild or a transfer failed here or
            # on a peer; torchft numbers the next quorum anew, so that its group is built afresh
            failures += 1
            error = str(failed).splitlines()[0][:200] if failed else None  # (torchft's adds its traceback)
            self.events.append({"step": counters.step, "attempt": attempt, "error": error})
            self._restore(snap)
            if failures > self.ft.max_retries:
                last = error or "a peer's"
                raise CommunicationError(f"replica {self.transport.rank}: step {counters.step} was not committed in "
                                         f"{failures} attempts (the last failure: {last})")

    def _vote(self) -> tuple[bool, Exception | None]:
        """``Manager.should_commit``: (committed, None), or (False, the error) when the vote's own
        request failed. It goes to this replica's own torchft server and must be answered within
        timeout_s: a process stopped (SIGSTOP, a paused VM) or starved of the CPU across it finds
        the request's deadline passed when it runs again, and torchft's client raises
        (``TimeoutError: status: Cancelled, message: "Timeout expired"``). That is a vote that
        failed, not the end of the run: the attempt is not committed, torchft's count of failed
        votes in a row goes up as for a vote against (the Lighthouse then numbers the next quorum
        anew, so its group is built afresh), and the step is retried; a replica that fell behind
        meanwhile heals in the retry's quorum. The server answers one vote per request (a group of
        one process), so a request that timed out leaves nothing behind in it."""
        manager = self.manager
        try:
            return manager.should_commit(timeout=timedelta(seconds=self.ft.timeout_s)), None
        except TimeoutError as e:  # the client's own (recorded by _QuorumSeen), or raised elsewhere: re-raised
            if e is not getattr(manager._client, "vote_failed", None):
                raise
            manager._commit_failures += 1
            return False, e

    def _quorum(self, deadline: float) -> bool:
        """``Manager.start_quorum``; False when the quorum request failed (the Lighthouse restarts,
        a link is down) and there is time left to ask again; raises once ``deadline`` has passed.

        Only the request's own failure is asked again. With ``use_async_quorum=False`` torchft also
        installs a peer's state inside ``start_quorum`` (:meth:`recover`), after it has moved its
        step to the quorum's: a failed install asked again would not heal again, and the replica
        would compute and commit on a half-installed state. It raises instead (a transfer that
        failed is not raised: torchft reports it to the Manager, the attempt is not committed, and
        the next quorum heals again)."""
        try:  # one request waits at most timeout_s, so that a lost Lighthouse is asked again in time
            left = max(deadline - time.monotonic(), 0.001)
            self.manager.start_quorum(timeout=timedelta(seconds=min(self.ft.timeout_s, left)))
            return True
        except Exception as e:  # noqa: BLE001 - torchft reports an unreachable Lighthouse as several types
            if e is not getattr(self.manager._client, "failed", None):
                raise
            if time.monotonic() >= deadline:
                raise CommunicationError(f"replica {self.transport.rank}: no quorum within quorum_timeout_s="
                                         f"{self.ft.quorum_timeout_s:g} s: {str(e).splitlines()[0][:160]}") from None
            self.events.append({"step": self.counters.step, "quorum_error": str(e).splitlines()[0][:200]})
            # the Manager keeps the failed request and raises it again at the next start_quorum: drop it
            self.manager._quorum_future = None
            time.sleep(self.ft.heartbeat_ms / 1000)
            return False

    def _mark(self, name: str, began: float | None = None) -> None:
        """Note when this attempt reached ``name`` (and, for the quorum, when its call began: the
        last attempt's counts) while the process has not committed a step yet."""
        if self.marks is not None:
            now = time.time()
            if began is not None:
                self.marks["quorum_call"] = now - (time.perf_counter() - began)
                self.marks.setdefault("first_quorum_call", self.marks["quorum_call"])
            self.marks[name] = now

    def _hold(self, path: str) -> None:
        deadline = time.monotonic() + self.ft.quorum_timeout_s
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)

    def leave(self) -> None:
        """Leave the job cleanly (``GRADWIRE_FT_LEAVE_AT``): the Lighthouse stops hearing from this
        replica, and the others' next quorum is formed without it, with no failed collective."""
        self.manager.shutdown(wait=False)
        os._exit(0)

    def close(self) -> None:
        """Stop the state server (and drop the state it may still hold for a recipient); the run
        closes it through its transport (``FtTransport.close``)."""
        self.checkpoints.shutdown()
