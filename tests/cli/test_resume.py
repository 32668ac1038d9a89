"""--resume says what it does: nothing to resume is one line and exit 2 (--resume-or-start starts
instead), a finished run is left as it is (exit 0), and a resumed run's wall time and lost workers
continue from its checkpoint."""

import json
import time
import types

import pytest
import torch

from gradwire.cli import main
from gradwire.run.loop import run
from tests.helpers import AsyncServerSide, read_jsonl

TINY = ["--task", "digits-logreg", "--workers", "2", "--steps", "4", "--eval-every", "2"]


def tiny(data_dir, *args: str) -> list[str]:
    return ["run", *TINY, "--data-dir", str(data_dir), *args]


def test_resume_with_nothing_to_resume_is_one_line_and_exit_2(tmp_path, data_dir, capsys):
    typo = tmp_path / "typo"
    assert main(tiny(data_dir, "--out", str(typo), "--resume")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gradwire run: error: resume=true: nothing to resume: run folder {typo} does not exist; check "
                   "--out, or pass --resume-or-start to start from step 0 when there is no checkpoint (--resume)"]
    assert not typo.exists()
    no_checkpoint = tmp_path / "plain"
    assert main(tiny(data_dir, "--out", str(no_checkpoint))) == 0
    before = {p.name: p.read_bytes() for p in no_checkpoint.iterdir() if p.is_file()}
    capsys.readouterr()
    # a finished run without a checkpoint: neither flag may replace it (--overwrite may)
    for flag in ("--resume", "--resume-or-start"):
        assert main(tiny(data_dir, "--out", str(no_checkpoint), "--steps", "6", flag)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"gradwire run: error: {flag[2:].replace('-', '_')}=true: run folder {no_checkpoint} holds a "
                       "run that finished at step 4 and saved no checkpoint to continue it from; starting again from "
                       "step 0 would replace it: pass --overwrite to replace it, or choose another --out "
                       f"({flag})"], err
        assert {p.name: p.read_bytes() for p in no_checkpoint.iterdir() if p.is_file()} == before
    assert main(tiny(data_dir, "--out", str(no_checkpoint), "--resume-or-start")) == 0  # the same steps: done
    assert capsys.readouterr().out.strip().endswith("nothing rewritten (it saved no checkpoint, so more --steps "
                                                    "need a new run: --overwrite or another --out)")
    assert {p.name: p.read_bytes() for p in no_checkpoint.iterdir() if p.is_file()} == before
    # an unfinished run without a checkpoint (what a restarted attempt finds) is started again
    stopped = json.loads((no_checkpoint / "summary.json").read_text()) | {"status": "stopped"}
    (no_checkpoint / "summary.json").write_text(json.dumps(stopped))
    assert main(tiny(data_dir, "--out", str(no_checkpoint), "--steps", "6", "--resume-or-start")) == 0
    assert json.loads((no_checkpoint / "summary.json").read_text())["steps"] == 6
    # --resume-or-start: from step 0 where there is no checkpoint
    assert main(tiny(data_dir, "--out", str(typo), "--resume-or-start")) == 0
    summary = json.loads((typo / "summary.json").read_text())
    assert summary["status"] == "finished" and not summary["resumed"] and summary["steps"] == 4
    capsys.readouterr()
    assert main(tiny(data_dir, "--out", str(tmp_path / "both"), "--resume", "--resume-or-start")) == 2
    assert capsys.readouterr().err.strip() == ("gradwire run: error: --resume refuses a folder with nothing to "
                                               "resume and --resume-or-start starts one from step 0: pass one of "
                                               "them (--resume)")
    assert not (tmp_path / "both").exists()


def test_resume_of_a_finished_run_says_so_and_rewrites_nothing(tmp_path, data_dir, capsys):
    out = tmp_path / "done"
    assert main(tiny(data_dir, "--out", str(out), "--checkpoint-every", "2")) == 0
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != ".gradwire.lock")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
    capsys.readouterr()
    for flag in ("--resume", "--resume-or-start"):
        assert main(tiny(data_dir, "--out", str(out), "--checkpoint-every", "2", flag)) == 0
        captured = capsys.readouterr()
        assert captured.out.strip() == (f"gradwire run: run folder {out} already finished at step 4; nothing to "
                                        "resume, nothing rewritten (--steps beyond it continues the run from its "
                                        "checkpoint)") and captured.err == ""
    assert sorted(p for p in out.rglob("*") if p.is_file() and p.name != ".gradwire.lock") == files
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == before
    # more steps continue it
    assert main(tiny(data_dir, "--out", str(out), "--checkpoint-every", "2", "--steps", "6", "--resume")) == 0
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [0, 2, 4, 6]


def test_compare_resume_keeps_finished_variants_and_starts_the_rest(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    common = ["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--checkpoint-every", "2"]
    assert main([*common, "--variant", "--algorithm sync"]) == 0
    summary = (out / "sync" / "summary.json").read_bytes()
    capsys.readouterr()
    assert main([*common, "--variant", "--algorithm sync", "--variant", "--algorithm local", "--resume"]) == 0
    assert "already finished at step 4" in capsys.readouterr().out
    assert (out / "sync" / "summary.json").read_bytes() == summary
    assert json.loads((out / "local" / "summary.json").read_text())["steps"] == 4
    empty = tmp_path / "empty"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(empty), "--variant", "--algorithm sync",
                 "--resume"]) == 2
    assert "nothing to resume: compare folder" in capsys.readouterr().err


def test_wall_time_continues_across_a_resume(make_config, tmp_path, capsys):
    """The resumed run's wall_time_s and eval_time_s go on from the checkpoint's (they restarted at 0);
    it says which step it continues from, on stderr and in the summary."""
    first_summary = run(make_config(out="split", steps=8, checkpoint_every=8, eval_every=4), progress=False)
    assert not first_summary["resumed"] and first_summary["resumed_from_step"] is None
    first = read_jsonl(tmp_path / "split" / "metrics.jsonl")
    assert "resuming" not in capsys.readouterr().err
    time.sleep(0.05)
    summary = run(make_config(out="split", steps=12, checkpoint_every=8, eval_every=4, resume=True), progress=False)
    assert f"gradwire: resuming {tmp_path / 'split'} from its checkpoint at step 8" in capsys.readouterr().err
    rows = read_jsonl(tmp_path / "split" / "metrics.jsonl")
    assert summary["resumed"] and summary["resumed_from_step"] == 8 and [r["step"] for r in rows] == [0, 4, 8, 12]
    assert rows[:3] == first
    assert rows[3]["wall_time_s"] > first[-1]["wall_time_s"] and rows[3]["eval_time_s"] >= first[-1]["eval_time_s"]
    assert summary["wall_time_s"] >= rows[3]["wall_time_s"]
    training = [r["wall_time_s"] - r["eval_time_s"] for r in rows]
    assert training == sorted(training)


class _Sent:
    def wait(self, timeout):
        pass


class _Transport:
    def send(self, *args, **kwargs):
        return _Sent()


def _server(n: int):
    from gradwire.servers.real import RealServer

    server = object.__new__(RealServer)  # the state and the summary only: no process group
    server.n, server.algo, server.transport, server.timeout_s = n, AsyncServerSide(), _Transport(), 1.0
    server.lost, server.lost_in_run, server.in_flight, server.orphans = {}, {}, {}, []
    server.said_bye, server.finished, server.refused_bytes, server.rejoined = set(), False, 0, set()
    server.received, server.counts = {w: 0 for w in range(n)}, {w: 0 for w in range(n)}
    server.ctx = types.SimpleNamespace(device=torch.device("cpu"))
    return server


def test_a_resumed_server_still_names_the_workers_lost_before_its_checkpoint(tmp_path):
    before = _server(3)
    before._lose(1, "SIGKILL (signal 9)")
    before.refused_bytes = 77  # a reply to worker 1 that its transport refused
    state = {"server": before._cut_state([])}  # the server's entry in the checkpoint of a cut
    assert state["server"]["lost"] == {"1": "SIGKILL (signal 9)"}
    for rank in (0, 1, 3):  # worker 1 (rank 2) was lost before the checkpoint: it has no state file
        (tmp_path / f"rank{rank}.pt").write_bytes(b"")
    after = _server(3)
    after.load_state_dict(state, tmp_path)
    assert after.algo.told == [1] and after.lost == {}  # it will rejoin
    after.said_bye = {0, 1, 2}  # ... and did, and finished
    summary = after.finish()
    assert summary["lost_workers"] == [1] and summary["lost_reasons"] == {"1": "SIGKILL (signal 9)"}
    assert summary["answers_refused_bytes"] == 77  # kept across the resume, as the losses are
    assert summary["rejoined_workers"] == []  # (no HELLO handled here)
    older = {"server": dict(state["server"])}
    older["server"].pop("lost")  # a checkpoint written before losses were kept: none named
    again = _server(3)
    again.load_state_dict(older, tmp_path)
    again.said_bye = {0, 1, 2}
    assert again.finish()["lost_workers"] == []


@pytest.mark.parametrize("flag", ["--resume", "--resume-or-start"])
def test_resume_without_out_names_the_folder_to_give(tmp_path, data_dir, capsys, monkeypatch, flag):
    monkeypatch.chdir(tmp_path)
    assert main(tiny(data_dir, flag)) == 2
    assert "--resume continues the run in --out" in capsys.readouterr().err


def _rows(path) -> list[dict]:
    """A run folder's rows without the wall-clock figures (which differ between any two runs)."""
    return [{k: v for k, v in row.items() if k not in ("wall_time_s", "eval_time_s")} for row in read_jsonl(path)]


def _files(folder) -> dict:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".gradwire.lock"}


def test_resume_with_fewer_steps_than_a_finished_run_is_refused(tmp_path, data_dir, capsys):
    """--steps below a finished run's would resume from its checkpoint and cut it short, dropping
    the rows after that checkpoint (it did, exit 0): refused, naming both counts, nothing touched.
    Also with --steps equal to the latest checkpoint's step (6 here): the resume would end at once
    and rewrite the summary of the 8-step run as one of 6."""
    out = tmp_path / "done"
    assert main(tiny(data_dir, "--out", str(out), "--steps", "8", "--checkpoint-every", "3")) == 0
    before = _files(out)
    capsys.readouterr()
    for steps in (7, 6):
        for flag in ("--resume", "--resume-or-start"):
            assert main(tiny(data_dir, "--out", str(out), "--steps", str(steps), "--checkpoint-every", "3",
                             flag)) == 2, (steps, flag)
            assert capsys.readouterr().err.strip().splitlines() == [
                f"gradwire run: error: steps={steps}: run folder {out} holds a run that finished at step 8, more "
                f"than --steps {steps}; resuming would cut it short and drop its rows after its checkpoint: pass "
                "--steps 8 or more to continue it, --overwrite to replace it, or choose another --out (--steps)"]
            assert _files(out) == before


@pytest.mark.parametrize("first", [10, 11])
def test_a_run_continued_to_more_steps_has_the_rows_of_one_run(tmp_path, data_dir, first):
    """Evaluated every 3 steps (and at the last), checkpointed every 5: a run of ``first`` steps
    continued to 15 from its checkpoint at step 10 writes the rows of a 15-step run bit for bit.
    first=10: step 10 was evaluated only because it was the last; the continued run has no row
    there, and its batch_loss at 12 still averages steps 10 to 12 (the row stayed and the window
    was emptied). first=11: the checkpoint lies between evaluations, its window holds step 10's
    loss (a resume that lost it passed every other test: they all checkpoint where it is empty)."""
    common = [*TINY[:4], "--eval-every", "3", "--checkpoint-every", "5", "--data-dir", str(data_dir)]
    assert main(["run", *common, "--steps", "15", "--out", str(tmp_path / "whole")]) == 0
    assert main(["run", *common, "--steps", str(first), "--out", str(tmp_path / "split")]) == 0
    assert main(["run", *common, "--steps", "15", "--out", str(tmp_path / "split"), "--resume"]) == 0
    assert json.loads((tmp_path / "split" / "summary.json").read_text())["resumed_from_step"] == 10
    for name in ("metrics.jsonl", "steps.jsonl"):
        assert _rows(tmp_path / "split" / name) == _rows(tmp_path / "whole" / name), name
    assert [r["step"] for r in read_jsonl(tmp_path / "split" / "metrics.jsonl")] == [0, 3, 6, 9, 12, 15]


def test_a_line_cut_off_by_a_crash_does_not_stop_the_resume(tmp_path, data_dir):
    """A crash while a row was written leaves a cut last line in steps.jsonl and metrics.jsonl:
    --resume drops it with the other rows after the checkpoint (it was a JSONDecodeError traceback
    on every --resume) and ends with the rows of a run never interrupted."""
    common = [*TINY[:4], "--eval-every", "3", "--checkpoint-every", "5", "--data-dir", str(data_dir)]
    assert main(["run", *common, "--steps", "15", "--out", str(tmp_path / "whole")]) == 0
    split = tmp_path / "split"
    assert main(["run", *common, "--steps", "11", "--out", str(split)]) == 0
    (split / "summary.json").unlink()  # a crash: no summary, a row half written
    for name in ("steps.jsonl", "metrics.jsonl"):
        with open(split / name, "a") as f:
            f.write('{"step": 12, "loss": 0.2')
    assert main(["run", *common, "--steps", "15", "--out", str(split), "--resume"]) == 0
    for name in ("metrics.jsonl", "steps.jsonl"):
        assert _rows(split / name) == _rows(tmp_path / "whole" / name), name
    assert not list(split.glob("*.tmp"))


def test_a_report_of_the_run_before_it_went_on_is_removed_and_said(tmp_path, data_dir, capsys):
    out = tmp_path / "run"
    args = ["run", *TINY, "--checkpoint-every", "2", "--no-curves", "--data-dir", str(data_dir), "--out", str(out)]
    assert main(args) == 0
    assert main(["report", str(out)]) == 0 and (out / "report.html").exists()
    capsys.readouterr()
    assert main([*args, "--steps", "6", "--resume"]) == 0
    assert not (out / "report.html").exists()
    assert f"removed {out / 'report.html'}, the report of the run before it went on" in capsys.readouterr().err
    assert main(["report", str(out)]) == 0 and (out / "report.html").exists()
