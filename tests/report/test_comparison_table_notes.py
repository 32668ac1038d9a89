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
