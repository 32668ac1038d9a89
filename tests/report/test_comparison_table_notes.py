"""``gradwire report`` on a comparison whose comparison.csv and variant folders disagree: it says so,
naming the missing variant or the table it cannot use (it said "2 variants" and nothing else, or
"holds no run ... and no variant run folders" beside the variants' folders)."""

import shutil

import pytest

from gradwire.cli import main

TINY = ["--task", "digits-logreg", "--workers", "2", "--steps", "2", "--eval-every", "2"]


@pytest.fixture
def comparison(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--data-dir", str(data_dir), "--out", str(out), "--no-html",
                 "--variant", "--algorithm sync", "--variant", "--name q --compressor qsgd:levels=4"]) == 0
    capsys.readouterr()
    return out


def test_a_variant_the_table_names_without_its_folder_is_named(comparison, capsys):
    shutil.rmtree(comparison / "q")
    assert main(["report", str(comparison)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gradwire report: warning: ") and "names variant 'q'" in err[0], err
    html = (comparison / "report.html").read_text()
    assert "names variant &#x27;q&#x27;" in html or "names variant 'q'" in html


def test_a_table_that_is_not_one_is_named_and_the_runs_shown(comparison, capsys):
    (comparison / "comparison.csv").write_text("\x00garbage;;\nnot,a,table\n")
    assert main(["report", str(comparison)]) == 0
    err = capsys.readouterr().err
    assert f"{comparison / 'comparison.csv'} is not a comparison table" in err, err
    assert "2 variants" in (comparison / "report.html").read_text()


def test_a_folder_of_separate_runs_with_one_label_tells_them_apart(tmp_path, data_dir, capsys):
    """Three separate `gradwire run`s of sync (each labelled `sync`) under one folder: the page names
    each by its folder, in the summary table and the curves (keyed by label, one would hide another)."""
    parent = tmp_path / "runs"
    for name, workers in (("a", "2"), ("b", "3"), ("c", "2")):
        assert main(["run", "--task", "digits-logreg", "--workers", workers, "--steps", "2", "--eval-every", "2",
                     "--no-curves", "--data-dir", str(data_dir), "--out", str(parent / name)]) == 0
    capsys.readouterr()
    assert main(["report", str(parent)]) == 0
    html = (parent / "report.html").read_text()
    for name in ("a", "b", "c"):
        assert f"sync ({name})" in html
    from gradwire.report.pages import RunData, distinct_labels

    runs = [RunData(parent / n) for n in ("a", "b", "c")]
    distinct_labels(runs)
    assert [r.label for r in runs] == ["sync (a)", "sync (b)", "sync (c)"]
