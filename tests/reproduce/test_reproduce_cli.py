"""``gradwire reproduce`` end to end (one small claim, in-process) and its bad input."""

from __future__ import annotations

import html
import json

import pytest

from gradwire import reproduce
from gradwire.cli import main
from gradwire.reproduce.claim import VERDICTS


def test_one_claim_end_to_end_writes_claims_json_markdown_and_plot(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["reproduce", "--quick", "--only", "lsgd-symmetry", "--out", str(out)]) == 0
    data = json.loads((out / "claims.json").read_text())
    assert data["mode"] == "quick" and data["command"] == "gradwire reproduce --quick --only lsgd-symmetry"
    [claim] = data["claims"]
    assert set(claim) == {"name", "title", "citation", "statement", "setup", "columns", "rows", "checks", "verdict",
                          "reason", "measured", "plot", "runs", "wall_time_s", "notes"}
    assert claim["name"] == "lsgd-symmetry" and claim["verdict"] in VERDICTS
    assert claim["citation"].startswith("Y. Teng, W. Gao") and "NeurIPS 2019" in claim["citation"]
    # the seeds the library's own test asserts on (tests/algorithms/test_leader_sgd.py): LSGD in a well, EASGD's
    # center at the saddle, so both criteria hold in every one of the 4 quick seeds
    assert claim["measured"]["seeds"] == [0, 1, 2, 3]
    assert all(f < 0.1 for f in claim["measured"]["lsgd_f"]) and all(f > 0.5 for f in claim["measured"]["easgd_f"])
    assert [c["passed"] for c in claim["checks"]] == [True, True] and claim["verdict"] == "reproduced"
    assert [row[0] for row in claim["rows"]] == [0, 1, 2, 3] and len(claim["columns"]) == 3
    assert claim["plot"] == "lsgd-symmetry/lsgd-symmetry.png"
    assert (out / claim["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "reproduce.md").read_text()
    assert "## LSGD escapes the symmetric saddle where EASGD's center is trapped (`lsgd-symmetry`)" in md
    assert "**Verdict: reproduced.**" in md and "![lsgd-symmetry](lsgd-symmetry/lsgd-symmetry.png)" in md
    assert "| LSGD escapes the symmetric saddle" in capsys.readouterr().out
    page = (out / "report.html").read_text()  # the same, self-contained: the plot inlined, the verdict, each check
    assert page.count('<img src="data:image/png;base64,') == 1 and "reproduced" in page
    assert "LSGD escapes the symmetric saddle where EASGD&#x27;s center is trapped (lsgd-symmetry): reproduced" in page
    assert all(html.escape(c["criterion"]) in page for c in claim["checks"])
    [loaded] = reproduce.load_claims(out)
    assert loaded.verdict == "reproduced" and loaded.checks[0].criterion == claim["checks"][0]["criterion"]
    # the same folder again is refused unless --overwrite
    assert main(["reproduce", "--quick", "--only", "lsgd-symmetry", "--out", str(out)]) == 2
    assert "already holds a reproduction (claims.json); pass --overwrite" in capsys.readouterr().err


@pytest.mark.parametrize("only, problem", [("nosuch", "unknown claim 'nosuch' for --only"),
                                           ("dagc,nosuch,other", "unknown claim 'nosuch', 'other' for --only"),
                                           (",", "--only ',' names no claim"), ("", "--only '' names no claim"),
                                           (" ", "--only ' ' names no claim")])
def test_unknown_claim_is_one_line_naming_the_valid_ones(tmp_path, capsys, only, problem):
    """A name that is no claim, and an --only that names none (``--only ""`` ran every claim), are refused."""
    assert main(["reproduce", "--only", only, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err == (f"gradwire reproduce: error: {problem}; valid: backup-workers, "
                   "diana-optimum, diana-norms, lsgd-symmetry, lsgd-easgd, dagc, dqsgd, dasgd\n")
    assert not (tmp_path / "x").exists()


def test_list_names_every_claim(capsys):
    assert main(["reproduce", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(reproduce.CLAIMS)
    assert lines[0].endswith("(Chen et al. 2016)")


def test_variants_run_through_the_run_loop_and_quick_leaves_the_plots_out(tmp_path):
    from gradwire.config import RunConfig
    from gradwire.report.run_folder import read_jsonl
    from gradwire.reproduce.claim import variants

    common = RunConfig(task="synthetic-logreg:samples=80,dim=4", workers=2, batch_size="full", dtype="float64",
                       steps=6, eval_every=3, data_dir=str(tmp_path / "data"))
    res = variants(tmp_path / "runs", common, {"a b": {"algorithm": "sync"}, "c": {"algorithm": "diana"}}, "t",
                   report=False)
    assert list(res) == ["a b", "c"] and res["a b"].folder == tmp_path / "runs" / "a_b"
    for r in res.values():
        assert [m["step"] for m in r.metrics] == [0, 3, 6] and r.metrics == read_jsonl(r.folder / "metrics.jsonl")
        assert r.summary["status"] == "finished" and r.summary["steps"] == 6 and len(r.steps()) == 6
        assert (r.folder / "summary.json").exists() and not (r.folder / "curves.png").exists()
    assert not (tmp_path / "runs" / "comparison.md").exists()
    assert res["c"].summary["label"] == "c"


def test_reproduce_refuses_a_run_or_a_comparison_folder_even_with_overwrite(tmp_path, data_dir, capsys):
    """A reproduction needs a folder of its own, as a run and a comparison do: one that holds a run
    or a comparison is refused, --overwrite or not (it replaced their report.html, exit 0), and a
    run or a comparison refuses a reproduction's folder in turn; nothing in them changes."""
    small = ["--task", "digits-logreg", "--workers", "2", "--steps", "2", "--eval-every", "2",
             "--data-dir", str(data_dir)]
    run_dir, cmp_dir, rep_dir = tmp_path / "one", tmp_path / "cmp", tmp_path / "rep"
    assert main(["run", *small, "--out", str(run_dir)]) == 0
    assert main(["compare", *small, "--out", str(cmp_dir), "--variant", "--algorithm sync"]) == 0
    rep_dir.mkdir()
    (rep_dir / "claims.json").write_text('{"claims": []}\n')  # what a reproduction leaves at its top
    capsys.readouterr()
    before = {p: p.read_bytes() for d in (run_dir, cmp_dir, rep_dir) for p in sorted(d.rglob("*")) if p.is_file()}
    for extra in ([], ["--overwrite"]):
        for folder, kind, marker in ((run_dir, "run", "summary.json"), (cmp_dir, "comparison", "comparison.md")):
            assert main(["reproduce", "--quick", "--only", "lsgd-symmetry", "--out", str(folder), *extra]) == 2
            assert capsys.readouterr().err == (f"gradwire reproduce: error: reproduce folder {folder} holds a {kind} "
                                               f"({marker}): a reproduction needs a folder of its own, its claims in "
                                               "subfolders; choose another --out\n")
        assert main(["run", *small, "--out", str(rep_dir), *extra]) == 2
        assert capsys.readouterr().err == (f"gradwire run: error: run folder {rep_dir} holds a reproduction "
                                           "(claims.json): a run needs a folder of its own; choose another --out\n")
        assert main(["compare", *small, "--out", str(rep_dir), "--variant", "--algorithm sync", *extra]) == 2
        assert capsys.readouterr().err == (f"gradwire compare: error: compare folder {rep_dir} holds a reproduction "
                                           "(claims.json): a comparison needs a folder of its own, its runs in "
                                           "subfolders; choose another --out\n")
    after = {p: p.read_bytes() for d in (run_dir, cmp_dir, rep_dir) for p in sorted(d.rglob("*")) if p.is_file()}
    assert after == before


def test_overwrite_removes_the_replaced_reproductions_other_claim_folders(tmp_path, capsys):
    """--overwrite replaces the reproduction: the folders of claims its claims.json names that the new
    one does not run go once the new report is written (they stayed beside it); a folder its record
    does not name stays."""
    out = tmp_path / "rep"
    (out / "dagc").mkdir(parents=True)
    (out / "dagc" / "dagc.png").write_bytes(b"old")
    (out / "mine").mkdir()
    (out / "mine" / "notes.txt").write_text("kept")
    (tmp_path / "elsewhere").mkdir()  # a claim's name that is now a link to a folder elsewhere: not its own
    (out / "diana").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (out / "claims.json").write_text(json.dumps({"mode": "quick", "claims": [{"name": "dagc"}, {"name": ".."},
                                                                              {"name": "diana"}]}))
    assert main(["reproduce", "--quick", "--only", "lsgd-symmetry", "--out", str(out), "--overwrite"]) == 0
    assert "removed the replaced reproduction's claim folders: dagc\n" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["diana", "lsgd-symmetry", "mine"]
    assert (tmp_path / "elsewhere").is_dir()
    assert (out / "mine" / "notes.txt").read_text() == "kept" and tmp_path.is_dir()
    assert [c["name"] for c in json.loads((out / "claims.json").read_text())["claims"]] == ["lsgd-symmetry"]
