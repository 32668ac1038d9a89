"""The per-rank supervisor ``gradwire launch`` has torchrun start: ``gradwire run`` as a child process.

    python -m gradwire.cli.supervise [--server-algorithm] [--resume-on-restart] [--launcher-pid PID] [--] CMD...

torchrun's elastic agent tears the whole group down as soon as any process exits non-zero, which
is right for collective algorithms (one lost rank stalls every collective) and wrong for the
server-mode ones, whose server carries on without a lost worker (``servers/real.py``). The agent
cannot be told which is which, so the supervisor tells it, per rank:

- it runs CMD (``python -u -m gradwire run ...``) with the same environment, in a process group
  of its own, and with ``PR_SET_PDEATHSIG`` = SIGKILL so the child dies with the supervisor;
- the supervisor itself gets SIGTERM when the launcher dies (``PR_SET_PDEATHSIG`` again;
  elsewhere it polls its parent), forwards SIGTERM, SIGINT, SIGHUP and SIGQUIT to the child
  (once: torchrun signals the supervisor's process group, which the child is not in), and when
  orphaned SIGKILLs the child ``GRACE_S`` later: killing the launcher leaves nothing behind;
- when the child ends with a signal or a non-zero code, ``--server-algorithm`` was given, this is
  not process 0 (``RANK``) and torchrun has no restart left (``TORCHELASTIC_MAX_RESTARTS`` minus
  ``TORCHELASTIC_RESTART_COUNT``), the rank was a worker the server can lose: it says so in one
  line and exits 0, so the agent keeps the survivors running. With a restart left the group
  restarts instead and comes back whole from the last checkpoint (the user asked for restarts;
  the last attempt carries on without the worker). Otherwise (process 0, a collective algorithm,
  a stop the supervisor was asked for) it ends exactly as the child did, by the same signal or
  with the same code, so torchrun's report and ``--max-restarts`` see what they would have seen
  without it;
- a child that exits 2 refused its configuration (one line says why): the supervisor ends with 2
  at once, never "lost", and creates the file ``GRADWIRE_LAUNCH_REFUSED`` names, so that a
  restarted attempt's supervisors end with 2 without running it and the launcher exits 2;
- ``--resume-on-restart``: in a restarted attempt (``TORCHELASTIC_RESTART_COUNT`` > 0) CMD gets
  ``--resume-or-start``, so a restarted group resumes from the last checkpoint (or starts again
  from step 0 when none was saved), and loses ``--overwrite`` (``restarted_command``); on one node
  only once an earlier attempt claimed the run folder (the file ``GRADWIRE_LAUNCH_CLAIMED`` names
  exists): an attempt that ended before its claim leaves the folder as it was, and a restart then
  runs the command as given (an --overwrite still replaces, a run there is still refused).

Only the standard library: it starts in milliseconds and holds no torch.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
CONFIG_ERROR = 2  # gradwire's exit code for a configuration it refuses (cli/__init__.py)
REFUSED_ENV = "GRADWIRE_LAUNCH_REFUSED"  # the file that says so to the launcher and to later attempts (launch.py)
# the file the run's claim of its folder creates (report/run_folder.py, CLAIMED_ENV there): a restarted
# attempt resumes only a folder an earlier attempt claimed (single node: launch sets it only there)
CLAIMED_ENV = "GRADWIRE_LAUNCH_CLAIMED"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
GRACE_S = 10  # seconds: once the launcher is gone, the child's time to stop on SIGTERM before SIGKILL
POLL_S = 0.2  # seconds: the longest a forwarded signal waits; how often to look for the launcher


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    except OSError:
        return None


def set_parent_death_signal(libc, sig: int) -> None:
    """Linux: deliver ``sig`` to this process when its parent dies (a no-op elsewhere)."""
    if libc is not None:
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def die_with(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """End this process with ``sig`` when its parent ``parent_pid`` dies (Linux). Called once the
    process runs (a parent holding threads cannot use ``preexec_fn``), so a parent that died before
    the call is caught by comparing pids: this process was handed to another parent by then."""
    set_parent_death_signal(_libc(), sig)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def describe(code: int) -> str:
    """``SIGKILL, signal 9`` for a negative Popen return code, else ``exit code N``."""
    if code < 0:
        try:
            return f"{signal.Signals(-code).name}, signal {-code}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def end_like(code: int) -> None:
    """End this process as the child ended: by the same signal, or with the same code."""
    if code < 0:
        sig = -code
        sys.stdout.flush()
        sys.stderr.flush()
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)  # the signal arrives meanwhile; should its default be to ignore, exit as a shell would
        sys.exit(128 + sig)
    sys.exit(code)


def restarted_command(cmd: list[str]) -> list[str]:
    """The run command of a restarted attempt: with ``--resume-or-start`` (a checkpoint continues,
    none yet: step 0 again), unless it asks to resume itself. ``--overwrite`` goes (the first
    attempt replaced the folder already, and the run refuses it beside a resume flag: with it no
    restart could ever start); a ``--config`` file may set ``overwrite: true``, so ``--no-overwrite``
    then follows it (flags override the file)."""
    if {"--resume", "--resume-or-start"} & set(cmd):
        return cmd
    kept = [arg for arg in cmd if arg != "--overwrite"]
    if any(arg == "--config" or arg.startswith("--config=") for arg in cmd):
        kept.append("--no-overwrite")
    return [*kept, "--resume-or-start"]


def supervise(cmd: list[str], *, server_algorithm: bool, resume_on_restart: bool = False,
              launcher_pid: int | None = None) -> int:
    """Run ``cmd`` as described in the module docstring; returns the exit code to end with (a
    negative one: end by that signal)."""
    libc = _libc()
    parent = launcher_pid if launcher_pid is not None else os.getppid()
    set_parent_death_signal(libc, signal.SIGTERM)
    if os.getppid() != parent:  # the launcher died before we could ask to be told
        return -signal.SIGTERM
    refused = os.environ.get(REFUSED_ENV)
    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
    if restarted and refused and os.path.exists(refused):  # an earlier attempt refused its configuration:
        return CONFIG_ERROR  # no attempt may run it (a restart would resume a run the refusal protected)
    claimed = os.environ.get(CLAIMED_ENV)
    if resume_on_restart and restarted and (claimed is None or os.path.exists(claimed)):
        cmd = restarted_command(cmd)  # (not when no earlier attempt claimed the folder: it holds nothing of ours)
    me = os.getpid()

    def in_child() -> None:  # after fork, before exec
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # the child starts with no signal blocked
        os.setpgid(0, 0)  # torchrun signals our group; the child hears it from us, once
        set_parent_death_signal(libc, signal.SIGKILL)
        if os.getppid() != me:
            os._exit(1)

    stop: list[int] = []  # the signals we were asked to stop with

    def forward(sig, _frame) -> None:
        stop.append(sig)
        child.send_signal(sig)  # a no-op once the child is reaped (its pid may be another's by then)
        if os.getppid() != parent:  # orphaned: nobody else will ever SIGKILL the child
            signal.alarm(GRACE_S)

    # A stop that arrives before the handlers are in place waits, blocked, and is then forwarded
    # (unblocked, it would end the supervisor and with it, by PR_SET_PDEATHSIG, the child).
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    child = subprocess.Popen(cmd, preexec_fn=in_child)  # we start no threads: preexec_fn is safe
    signal.signal(signal.SIGALRM, lambda *_: child.kill())
    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    # Wait in short slices, never in one blocking waitpid: a Python signal handler runs only between
    # bytecodes, so a SIGTERM landing just before a blocking waitpid began would be forwarded only
    # once the child ended by itself (the race that hung the tests' stand-in child about once in 600
    # stops on a loaded machine: tests/backends/test_launch_faults.py).
    while True:
        try:
            code = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if not stop and os.getppid() != parent:  # the launcher is gone and no SIGTERM told us
            forward(signal.SIGTERM, None)
    rank = int(os.environ.get("RANK", "0"))
    if code == CONFIG_ERROR and not stop:  # the run refused its configuration (its one line said why): not a
        if refused:                        # lost worker, and nothing a restart would change
            with open(refused, "a"):
                pass
        return code
    if code == 0 or not server_algorithm or rank == 0 or stop:
        return code
    restarts_left = (int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
                     - int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    who = f"worker process {rank} (worker {rank - 1})"
    if restarts_left > 0:  # --max-restarts: the group comes back whole, from the last checkpoint
        print(f"gradwire launch: {who} ended ({describe(code)}); the group restarts "
              f"({restarts_left} restart{'s' if restarts_left > 1 else ''} left)", file=sys.stderr, flush=True)
        return code
    print(f"gradwire launch: {who} lost ({describe(code)}); the server carries on", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    opts = {"server_algorithm": False, "resume_on_restart": False, "launcher_pid": None}
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag == "--":
            break
        if flag == "--server-algorithm":
            opts["server_algorithm"] = True
        elif flag == "--resume-on-restart":
            opts["resume_on_restart"] = True
        elif flag == "--launcher-pid" and args:
            opts["launcher_pid"] = int(args.pop(0))
        else:
            sys.exit(f"gradwire.cli.supervise: unknown option {flag!r}")
    if not args:
        sys.exit("usage: python -m gradwire.cli.supervise [--server-algorithm] [--resume-on-restart] "
                 "[--launcher-pid PID] [--] COMMAND...")
    end_like(supervise(args, **opts))


if __name__ == "__main__":
    main()
