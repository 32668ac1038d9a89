"""Bad parameters of DiLoCo and Streaming DiLoCo are one clear line, naming the value and the rule."""

import pytest

from gradwire.cli import main


@pytest.mark.parametrize("spec, flags, needle", [
    ("diloco:inner_steps=0", [], "inner_steps must be >= 1 (inner steps per outer round), got 0"),
    ("diloco:outer_lr=0", [], "outer_lr must be a finite number > 0, got 0"),
    ("diloco:outer_lr=inf", [], "outer_lr must be a finite number > 0, got inf"),
    ("diloco:outer_momentum=1", [], "outer_momentum must be in [0, 1), got 1"),
    ("diloco:outer_warmup=-1", [], "outer_warmup must be >= 0 (outer rounds of momentum ramp), got -1"),
    ("diloco:inner=adam", [], "inner='adam': valid choices are adamw, sgd"),
    ("diloco:beta2=1.5", [], "beta2 must be in [0, 1), got 1.5"),
    ("diloco:eps=0", [], "eps must be a finite number > 0, got 0"),
    ("diloco:weight_decay=-0.1", [], "weight_decay must be a finite number >= 0, got -0.1"),
    ("diloco:fragments=2", [], "algorithm 'diloco' has no parameter 'fragments'"),
    ("streaming-diloco:inner_steps=4,fragments=5", [], "fragments must be in [1, inner_steps=4] (one staggered "
                                                       "offset each), got 5"),
    ("streaming-diloco:fragments=0", [], "fragments must be in [1, inner_steps=20]"),
    ("streaming-diloco:inner_steps=4,overlap=5", [], "overlap must be in [0, inner_steps=4] (at most one round of "
                                                     "a fragment in flight), got 5"),
    ("streaming-diloco:alpha=2", [], "alpha must be in [0, 1] (weight of the local parameters at a merge), got 2"),
    # α = 0 (the default) with τ = H: every round would send a zero outer gradient (docs/low_communication.md)
    ("streaming-diloco:inner_steps=4,overlap=4", [], "alpha=0 with overlap=4 = inner_steps discards every inner "
                                                     "step"),
    ("diloco", ["--momentum", "0.9"], "diloco with inner=adamw: --momentum and --weight-decay apply to inner=sgd; "
                                      "AdamW's are the spec's beta1, beta2 and weight_decay"),
    ("diloco", ["--error-feedback"], "--error-feedback needs --compressor"),
    ("diloco", ["--compressor", "qsgd:levels=0"], "levels"),
    ("streaming-diloco:inner_steps=4", ["--compressor", "powersgd:rank=2"],
     "--compressor powersgd:rank=2 averages gradients by allreduce itself: it runs with sync (without backups) and "
     "the DDP hook only"),
])
def test_bad_parameters_are_one_clear_line(tmp_path, data_dir, capsys, spec, flags, needle):
    code = main(["run", "--algorithm", spec, *flags, "--workers", "2", "--steps", "20", "--task", "digits-logreg",
                 "--out", str(tmp_path / "o"), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1, err
