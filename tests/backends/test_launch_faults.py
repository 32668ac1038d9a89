"""Faults under ``gradwire launch``: a worker the server can lose is lost, not fatal; a stopped
launcher leaves no process behind; the launcher counts the server however the algorithm is given.

The supervisor (``gradwire/cli/supervise.py``) is tested with stand-in children first (no torch, fast),
then through torchrun."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradwire.cli import build_parser
from gradwire.cli.launch import torchrun_argv
from gradwire.errors import ConfigError
from tests.backends.processes import launch

SUPERVISE = [sys.executable, "-m", "gradwire.cli.supervise"]
SELF_KILL = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
# A stand-in child that handles SIGTERM sleeps in short slices: Python runs a handler between
# bytecodes, so a signal landing just before one long sleep began would be handled only when the
# sleep ended (the supervisor forwards SIGTERM just as the child passes from print to sleep; this was
# the rare 30 s hang of test_supervisor_forwards_sigterm_and_a_stop_is_no_loss).
SLEEP_HEARING_SIGNALS = "for _ in range(600): time.sleep(0.1)"
WAIT_FOR_TERM = ("import signal, sys, time\n"
                 "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
                 "print('ready', flush=True)\n"
                 + SLEEP_HEARING_SIGNALS)


def supervised(code: str, *options: str, rank: int = 1, env: dict | None = None):
    env = dict(os.environ, RANK=str(rank)) | (env or {})
    return subprocess.run([*SUPERVISE, *options, sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def processes_with(text: str) -> list[int]:
    """Live processes whose command line holds ``text`` (the run's unique --out path)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text.encode() in (d / "cmdline").read_bytes() and alive(int(d.name)):
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.1)


# -- the supervisor, with stand-in children ---------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("server, rank, code, expected", [
    (True, 2, SELF_KILL, 0),                        # a server-mode worker: lost, the group goes on
    (True, 1, "raise SystemExit(4)", 0),
    (True, 0, SELF_KILL, -signal.SIGKILL),          # the server itself: fatal, reported as it happened
    (False, 2, SELF_KILL, -signal.SIGKILL),         # a collective algorithm: every rank is needed
    (False, 1, "raise SystemExit(3)", 3),
    (True, 2, "pass", 0),
])
def test_supervisor_ends_as_the_child_unless_the_server_can_lose_it(server, rank, code, expected):
    p = supervised(code, *(["--server-algorithm"] if server else []), rank=rank)
    assert p.returncode == expected, p.stderr
    lost = "lost" in p.stderr
    assert lost == (server and rank != 0 and code != "pass"), p.stderr
    if code == SELF_KILL and lost:
        assert f"worker process {rank} (worker {rank - 1}) lost (SIGKILL, signal 9); the server carries on" in p.stderr


@pytest.mark.timeout(60)
def test_a_lost_worker_restarts_the_group_while_a_restart_is_left():
    def attempt(count: str):
        return supervised(SELF_KILL, "--server-algorithm", rank=2,
                          env={"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_RESTART_COUNT": count})

    first, last = attempt("0"), attempt("1")
    assert first.returncode == -signal.SIGKILL and "the group restarts (1 restart left)" in first.stderr
    assert last.returncode == 0 and "the server carries on" in last.stderr


@pytest.mark.timeout(60)
def test_restarted_attempts_resume():
    show = "import sys; print(sys.argv[1:])"
    first = supervised(show, "--resume-on-restart", env={"TORCHELASTIC_RESTART_COUNT": "0"})
    again = supervised(show, "--resume-on-restart", env={"TORCHELASTIC_RESTART_COUNT": "1"})
    plain = supervised(show, env={"TORCHELASTIC_RESTART_COUNT": "1"})
    # --resume-or-start: a group that failed before its first checkpoint starts again from step 0
    assert (first.stdout.strip(), again.stdout.strip(), plain.stdout.strip()) == ("[]", "['--resume-or-start']", "[]")


@pytest.mark.timeout(60)
def test_supervisor_forwards_sigterm_and_a_stop_is_no_loss():
    p = subprocess.Popen([*SUPERVISE, "--server-algorithm", sys.executable, "-c", WAIT_FOR_TERM],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, RANK="2"))
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # should it hang again: say where each process was
        states = process_states(p.pid)
        for pid in states:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _, err = p.communicate(timeout=30)
        raise AssertionError(f"no end 30 s after SIGTERM; processes (stat, wchan): {states}; "
                             f"stderr: {err[-2000:]}") from None
    assert p.returncode == 7 and "lost" not in err  # the child's own answer to SIGTERM, not a lost worker


def process_states(pid: int) -> dict[int, tuple[str, str]]:
    """``pid`` and its children: each one's /proc stat line and the kernel function it waits in."""
    found = {}
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for p in [pid, *map(int, children)]:
        try:
            found[p] = (Path(f"/proc/{p}/stat").read_text().strip(), Path(f"/proc/{p}/wchan").read_text())
        except OSError as e:
            found[p] = (f"unreadable: {e}", "")
    return found


@pytest.mark.timeout(60)
def test_child_dies_with_its_supervisor():
    code = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    p = subprocess.Popen([*SUPERVISE, sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(p.stdout.readline())
    p.kill()
    p.wait(timeout=10)
    wait_until(lambda: not alive(child), 5, "the child of a SIGKILLed supervisor ended")


def orphan(child: str) -> tuple[int, int]:
    """A stand-in launcher starts a supervisor of ``child`` (which prints its pid) and is SIGKILLed;
    returns (supervisor pid, child pid)."""
    launcher = ("import os, subprocess, sys, time\n"
                f"p = subprocess.Popen({SUPERVISE!r} + ['--launcher-pid', str(os.getpid()), sys.executable, '-c', "
                f"{child!r}], stdout=subprocess.PIPE, text=True)\n"
                "print(p.pid, p.stdout.readline().strip(), flush=True)\n"
                "time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    supervisor, pid = map(int, p.stdout.readline().split())
    assert alive(pid)
    p.kill()
    p.wait(timeout=10)
    return supervisor, pid


@pytest.mark.timeout(60)
def test_supervisor_stops_its_child_when_the_launcher_dies(tmp_path):
    supervisor, child = orphan("import os, time; print(os.getpid(), flush=True); time.sleep(60)")
    wait_until(lambda: not alive(child) and not alive(supervisor), 5, "the killed launcher's processes ended")


@pytest.mark.timeout(60)
def test_an_orphaned_child_deaf_to_sigterm_is_killed_after_the_grace(tmp_path):
    from gradwire.cli.supervise import GRACE_S

    heard = tmp_path / "heard"
    deaf = ("import os, signal, time\n"
            f"signal.signal(signal.SIGTERM, lambda *_: open({str(heard)!r}, 'w').write('SIGTERM'))\n"
            "print(os.getpid(), flush=True)\n"
            + SLEEP_HEARING_SIGNALS)
    started = time.monotonic()
    supervisor, child = orphan(deaf)
    wait_until(heard.exists, 5, "the child was told SIGTERM")
    wait_until(lambda: not alive(child) and not alive(supervisor), GRACE_S + 5, "the deaf child was killed")
    assert time.monotonic() - started >= GRACE_S - 1


# -- the launcher's command line --------------------------------------------------------------------


def argv_of(*launch_args: str) -> list[str]:
    parser = build_parser()
    return torchrun_argv(parser.parse_args(["launch", *launch_args]))


def run_flag(argv: list[str], flag: str) -> str:
    return argv[len(argv) - 1 - argv[::-1].index(flag) + 1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("suffix, text", [(".yaml", "algorithm: async\nsteps: 5\n"),
                                          (".toml", 'algorithm = "sync:backups=1"\n'),
                                          (".yaml", "algorithm: diana\n")])
def test_workers_counted_from_a_config_file(tmp_path, suffix, text):
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    argv = argv_of("--nproc-per-node", "4", "--", "run", "--config", str(path))
    server = "diana" not in text
    assert run_flag(argv, "--workers") == str(4 - server)
    assert ("--server-algorithm" in argv) == server


@pytest.mark.timeout(60)
def test_workers_counted_from_algorithm_equals(capsys):
    argv = argv_of("--nproc-per-node", "4", "--", "run", "--algorithm=sync:backups=1")
    assert run_flag(argv, "--workers") == "3" and "--server-algorithm" in argv
    assert run_flag(argv_of("--nproc-per-node", "4", "--", "run", "--algorithm=sync"), "--workers") == "4"
    with pytest.raises(ConfigError, match="--workers 4 plus one server process needs 5 processes but 4 are started"):
        argv_of("--nproc-per-node", "4", "--", "run", "--algorithm=async", "--workers", "4")
    with pytest.raises(ConfigError, match="has a server"):
        argv_of("--nproc-per-node", "1", "--", "run", "--algorithm", "async")


@pytest.mark.timeout(60)
def test_max_restarts_resume_restarted_attempts(capsys):
    argv = argv_of("--nproc-per-node", "2", "--max-restarts", "2", "--", "run", "--checkpoint-every", "5")
    assert "--resume-on-restart" in argv and capsys.readouterr().err == ""
    argv = argv_of("--nproc-per-node", "2", "--max-restarts", "2", "--", "run")
    assert "--resume-on-restart" in argv and "starts again from step 0" in capsys.readouterr().err
    for given in ("--resume", "--resume-or-start", "--no-resume"):  # the run command decides for itself
        assert "--resume-on-restart" not in argv_of("--nproc-per-node", "2", "--max-restarts", "1", "--", "run", given)
    assert "--resume-on-restart" not in argv_of("--nproc-per-node", "2", "--", "run")


# -- through torchrun ------------------------------------------------------------------------------

RUN = ["--task", "digits-logreg", "--batch-size", "16", "--lr", "0.2", "--eval-every", "1", "--seed", "5",
       "--stragglers", "lognormal:sigma=0.2,compute_s=0.03"]


@pytest.mark.timeout(300)
def test_worker_killed_under_launch_is_survived(tmp_path, data_dir):
    # --algorithm=...: the launcher must count the server from this form too
    p = launch(4, RUN + ["--steps", "30", "--algorithm=sync:backups=1"], tmp_path / "lost", data_dir,
               extra_env={"GRADWIRE_KILL_AT": "1:3"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "worker process 2 (worker 1) lost (SIGKILL, signal 9); the server carries on" in p.stderr
    summary = json.loads((tmp_path / "lost" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 30 and summary["lost_workers"] == [1]
    assert summary["gradients_received"]["1"] == 3


@pytest.fixture
def reap():
    """Register a process started in the background: killed when the test ends, however it ends (a
    launcher of a million-step run, left behind by a failed assertion, would share the machine's two
    cores with every later test). SIGKILL to ``gradwire launch`` takes its whole group down."""
    started: list[subprocess.Popen] = []
    yield started.append
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)


def start_launch(tmp_path, data_dir, nproc: int, args: list[str], reap):
    """``gradwire launch`` of a long run in the background; returns (Popen, out folder) once process 0
    has evaluated twice."""
    out = tmp_path / "long"
    log = (tmp_path / "launch.log").open("w")
    p = subprocess.Popen([sys.executable, "-m", "gradwire", "launch", "--nproc-per-node", str(nproc), "--", "run",
                          *RUN, "--steps", "1000000", *args, "--out", str(out), "--data-dir", str(data_dir),
                          "--timeout-s", "30"], stdout=log, stderr=subprocess.STDOUT,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    reap(p)
    metrics = out / "metrics.jsonl"
    wait_until(lambda: p.poll() is not None or (metrics.exists() and len(metrics.read_text().splitlines()) >= 2),
               120, "the run started")
    assert p.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
    assert len(processes_with(str(out))) == 1 + 2 * nproc  # the launcher, a supervisor and a run per process
    return p, out


@pytest.mark.timeout(180)
def test_killing_the_launcher_leaves_no_process(tmp_path, data_dir, reap):
    p, out = start_launch(tmp_path, data_dir, 3, ["--algorithm", "sync:backups=1"], reap)
    p.kill()
    p.wait(timeout=10)
    wait_until(lambda: not processes_with(str(out)), 20, "every process of the killed launcher ended")


@pytest.mark.timeout(240)
def test_sigterm_to_launch_stops_with_a_summary_and_a_resumable_checkpoint(tmp_path, data_dir, reap):
    p, out = start_launch(tmp_path, data_dir, 2, ["--checkpoint-every", "2"], reap)
    wait_until(lambda: (out / "checkpoint" / "latest").exists(), 60, "a checkpoint was taken")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    wait_until(lambda: not processes_with(str(out)), 20, "every process of the stopped launcher ended")
    assert "stopped by SIGTERM" in (tmp_path / "launch.log").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped" and 0 < summary["steps"] < 1000000
    saved = summary["checkpoint_step"]  # the last regular checkpoint: every rank saved there
    assert saved is not None and saved % 2 == 0
    # --resume continues from it and finishes
    done = subprocess.run([sys.executable, "-m", "gradwire", "launch", "--nproc-per-node", "2", "--", "run", *RUN,
                           "--steps", str(saved + 2), "--checkpoint-every", "2", "--resume", "--out", str(out),
                           "--data-dir", str(data_dir), "--timeout-s", "30"], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["resumed"] and summary["steps"] == saved + 2


@pytest.mark.timeout(60)
def test_launch_hands_torchrun_a_thread_count_so_it_prints_no_banner(monkeypatch, caplog):
    """torchrun warns ("Setting OMP_NUM_THREADS environment variable for each process to be 1 ...")
    whenever it starts several processes and OMP_NUM_THREADS is unset; launch sets it first."""
    import logging

    import torch.distributed.run as torchrun

    from gradwire.cli.launch import start_group

    seen = {}

    def config_only(argv):  # torchrun's own reading of its arguments, where it warns; nothing started
        seen["config"] = torchrun.config_from_args(torchrun.parse_args(argv))

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(torchrun, "main", config_only)
    parser = build_parser()
    ns = parser.parse_args(["launch", "--nproc-per-node", "2", "--", "run", "--steps", "2"])
    with caplog.at_level(logging.WARNING):
        assert start_group(ns) == 0
    assert "config" in seen and os.environ["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in caplog.text


@pytest.mark.timeout(120)
def test_sigint_in_the_rendezvous_says_nothing_was_written(tmp_path, data_dir, reap):
    """Ctrl-C while the launcher waits in a two-node rendezvous (the other node never comes): one line
    that says no process started and nothing was written (not "metrics so far are in the run folder"),
    exit 130, no folder."""
    import socket

    from tests.backends.processes import free_port

    out, port = tmp_path / "never", free_port()
    # a child of this process would inherit an ignored SIGINT where pytest runs in the background
    # (bash ignores it in asynchronous commands): the launcher gets Python's default handler back
    restore = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)"
    p = subprocess.Popen([sys.executable, "-c", f"{restore}\nimport sys\nfrom gradwire.cli import main\n"
                          "sys.exit(main())", "launch", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
                          "--rdzv-endpoint", f"127.0.0.1:{port}", "--", "run", *RUN, "--steps", "3",
                          "--out", str(out), "--data-dir", str(data_dir), "--timeout-s", "60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    reap(p)

    def store_up() -> bool:  # node 0 serves the rendezvous's store at the endpoint: torchrun is in it
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False

    wait_until(lambda: p.poll() is not None or store_up(), 60, "the launcher reached the rendezvous")
    time.sleep(1)  # waiting there for the second node
    assert p.poll() is None, p.communicate()[1][-2000:]
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGINT, err[-2000:]
    line = [s for s in err.splitlines() if s.startswith("gradwire launch:")]
    assert line == ["gradwire launch: stopped by SIGINT while no process of this node was running (in the "
                    "rendezvous)"], err[-2000:]
    assert not out.exists()
