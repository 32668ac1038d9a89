"""A checkpoint that changed after it was written (a flipped byte, truncated, empty, not a
gradwire checkpoint) or that lies past --steps is refused with one ConfigError line naming the
file; an intact one resumes."""

import shutil
import zipfile

import pytest
import torch

from gradwire import checkpoint
from gradwire.cli import main
from gradwire.config import RunConfig
from gradwire.errors import ConfigError
from gradwire.run.loop import run
from tests.helpers import gw

STEPS = 4  # the written checkpoint is at step 4
FLAGS = dict(task="digits-logreg", workers=2, batch_size=16, lr=0.1, eval_every=2, checkpoint_every=STEPS)


@pytest.fixture(scope="module")
def written(tmp_path_factory, data_dir):
    """One short simulator run with a checkpoint at step 4, written once for the module."""
    out = tmp_path_factory.mktemp("written") / "run"
    run(RunConfig(**FLAGS, steps=STEPS, out=str(out), data_dir=str(data_dir)), progress=False)
    return out


@pytest.fixture
def copy(written, tmp_path, data_dir):
    """A fresh copy of the written run, its checkpoint file, and the config that resumes it."""
    out = tmp_path / "run"
    shutil.copytree(written, out)
    f = out / "checkpoint" / f"step-{STEPS:08d}" / "sim.pt"

    def cfg(steps: int = STEPS + 2) -> RunConfig:
        return RunConfig(**FLAGS, steps=steps, resume=True, out=str(out), data_dir=str(data_dir))

    return out, f, cfg


def refused(cfg: RunConfig, f, *needles: str) -> str:
    with pytest.raises(ConfigError) as e:
        run(cfg, progress=False)
    text = str(e.value)
    assert "\n" not in text and f"checkpoint {f} " in text, text
    for needle in needles:
        assert needle in text, text
    return text


def flip(f, at: int) -> None:
    data = bytearray(f.read_bytes())
    data[at] ^= 0xFF
    f.write_bytes(bytes(data))


def test_intact_checkpoint_resumes(copy):
    out, f, cfg = copy
    summary = run(cfg(2 * STEPS), progress=False)
    assert summary["resumed"] and summary["steps"] == 2 * STEPS
    payload = torch.load(f.parent.parent / f"step-{2 * STEPS:08d}" / "sim.pt", weights_only=True)
    assert payload["format"] == checkpoint.FORMAT and len(payload["sha256"]) == 64 and "state" in payload


def test_flipped_byte_in_the_middle(copy):
    out, f, cfg = copy
    flip(f, f.stat().st_size // 2)
    refused(cfg(), f)  # checksum mismatch, or unreadable where the byte hit the archive's structure


def test_flipped_byte_in_a_tensor_is_a_checksum_mismatch(copy):
    out, f, cfg = copy
    with zipfile.ZipFile(f) as z:  # torch.save stores records uncompressed: flip one in the largest tensor
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(f, "rb") as fh:
        fh.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(fh.read(2), "little") for _ in range(2))
    flip(f, info.header_offset + 30 + name_len + extra_len + info.file_size // 2)
    refused(cfg(), f, "is corrupt: checksum mismatch")


def test_truncated(copy):
    out, f, cfg = copy
    f.write_bytes(f.read_bytes()[: f.stat().st_size * 2 // 3])
    refused(cfg(), f, "truncated")


def test_empty(copy):
    out, f, cfg = copy
    f.write_bytes(b"")
    refused(cfg(), f, "is empty (0 bytes)")


@pytest.mark.parametrize("content", [b"garbage, not a zip archive", {"weights": torch.ones(3)}])
def test_not_a_gradwire_checkpoint(copy, content):
    out, f, cfg = copy
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        torch.save(content, f)
    refused(cfg(), f, "is not a gradwire checkpoint")


def test_edited_state_without_its_checksum(copy):
    """Contents rewritten with torch.save (a valid file) but not re-summed: a mismatch."""
    out, f, cfg = copy
    payload = torch.load(f, weights_only=True)
    payload["state"]["step"] += 0  # same value ...
    payload["step"] = STEPS - 1    # ... but a different step recorded
    torch.save(payload, f)
    refused(cfg(), f, "checksum mismatch")


def test_format_1_has_no_checksum(copy):
    out, f, cfg = copy
    payload = torch.load(f, weights_only=True)
    payload.pop("sha256")
    torch.save(payload | {"format": 1}, f)
    refused(cfg(), f, "has format 1", "no checksum")


def test_checkpoint_past_steps(copy):
    out, f, cfg = copy
    refused(cfg(steps=2), f, f"is at step {STEPS}, past --steps 2", f"--steps {STEPS} or more")


def test_corrupt_latest_marker(copy):
    out, f, cfg = copy
    (out / "checkpoint" / "latest").write_text("")
    with pytest.raises(ConfigError, match="checkpoint marker .*latest is corrupt"):
        run(cfg(), progress=False)


def test_cli_past_steps_one_line(copy, capsys, data_dir):
    out, f, cfg = copy
    code = main(["run", "--task", "digits-logreg", "--workers", "2", "--batch-size", "16", "--lr", "0.1",
                 "--eval-every", "2", "--checkpoint-every", str(STEPS), "--steps", "2", "--resume",
                 "--out", str(out), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"gradwire run: error: checkpoint {f} is at step {STEPS}, past --steps 2")
    assert len(err.strip().splitlines()) == 1


def test_cli_corrupt_checkpoint_exit_2_one_line(copy, data_dir):
    """Through ``python -m gradwire run --resume``: exit 2 and one line naming the file."""
    out, f, cfg = copy
    f.write_bytes(f.read_bytes()[:100])
    p = gw("run", "--task", "digits-logreg", "--workers", "2", "--batch-size", "16", "--lr", "0.1", "--eval-every", "2",
           "--checkpoint-every", str(STEPS), "--steps", "6", "--resume", "--out", str(out), "--data-dir", str(data_dir))
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"gradwire run: error: checkpoint {f} is unreadable (corrupt or truncated)")
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_digest_ignores_device_and_layout_but_not_values():
    a = {"x": torch.arange(6.0).reshape(2, 3).t(), "n": 3, "f": 0.1, "s": "sync", "l": [1, (2, None)], "b": True}
    b = {"x": torch.arange(6.0).reshape(2, 3).t().contiguous(), "n": 3, "f": 0.1, "s": "sync", "l": [1, (2, None)],
         "b": True}
    assert checkpoint.digest(a) == checkpoint.digest(b)
    for change in ({"n": 3.0}, {"b": 1}, {"f": 0.1 + 1e-17 * 2}, {"l": [1, [2, None]]}, {"x": b["x"].double()}):
        assert checkpoint.digest(b | change) != checkpoint.digest(b), change
