"""``--optimizer``: the update rule applied to the averaged gradient (sgd or adamw), one per algorithm path."""

import pytest
import torch

from gradwire.cli import main
from gradwire.errors import ConfigError
from gradwire.run.loop import Run, run
from tests.helpers import final_checkpoint, states_equal, torch_on_mean_gradient

ADAMW = dict(optimizer="adamw:beta2=0.95", lr=0.01, weight_decay=0.1)
MUON = dict(optimizer="muon:lr_ratio=5", lr=0.004, weight_decay=0.1)


def _torch_adamw_on_mean_gradient(r: Run, steps: int) -> torch.Tensor:
    """The same model and batches through torch.optim.AdamW on the nn.Module, stepping with the
    workers' mean gradient (what sync averages exactly, uncompressed)."""
    return torch_on_mean_gradient(
        r, steps, lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1))


@pytest.mark.parametrize("algorithm", ["sync", "local:period=1"])
def test_adamw_on_the_mean_gradient_equals_torch_adamw(make_config, algorithm):
    # local SGD with period 1 averages the replicas after every step: with one worker, plain AdamW
    workers = 3 if algorithm == "sync" else 1
    r = Run(make_config(ADAMW, algorithm=algorithm, workers=workers, steps=8))
    reference = _torch_adamw_on_mean_gradient(r, 8)
    for _ in range(8):
        r.train_step()
    torch.testing.assert_close(r.algorithm.eval_params(), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [
    dict(algorithm="sync", compressor="topk:ratio=0.1", error_feedback=True),
    dict(algorithm="sync:backups=1"),
    dict(algorithm="local:period=3"),
])
def test_adamw_state_resumes_bitwise(make_config, tmp_path, kw):
    # the moments m, v and the step count travel in the checkpoint: a run stopped after step 10 and
    # resumed from its step-8 checkpoint ends as the run that never stopped
    cfg = dict(ADAMW, steps=12, checkpoint_every=4, stragglers="lognormal:sigma=0.5", workers=3, **kw)
    run(make_config(cfg, out="whole"), progress=False)
    run(make_config(cfg, out="split", steps=10), progress=False)
    assert run(make_config(cfg, out="split", resume=True), progress=False)["resumed"]
    assert states_equal(final_checkpoint(tmp_path / "whole")["state"], final_checkpoint(tmp_path / "split")["state"])
    assert _holds_key(final_checkpoint(tmp_path / "whole")["state"], "exp_avg_sq")  # AdamW's moments were compared


class _ReferenceMuon:
    """Muon (Jordan et al. 2024) on the 2-D tensors, written from the blog post's update (momentum
    buffer B <- μB + G, Nesterov U = G + μB, decoupled decay, W <- W - η·sqrt(max(1, rows/cols))·NS5(U)),
    torch.optim.AdamW (β 0.9/0.95) on the rest: the reference for ``--optimizer muon``."""

    def __init__(self, params, *, lr, ratio, decay, mu=0.95, last_on_adamw=False):
        params = list(params)
        self.matrices = [p for p in params if p.dim() == 2]
        if last_on_adamw:  # the output layer's weight too on AdamW (muon:matrices=hidden)
            self.matrices = self.matrices[:-1]
        self.buffers = [torch.zeros_like(p) for p in self.matrices]
        self.eta, self.decay, self.mu = ratio * lr, decay, mu
        on_muon = {id(p) for p in self.matrices}
        self.adamw = torch.optim.AdamW([p for p in params if id(p) not in on_muon], lr=lr, betas=(0.9, 0.95),
                                       eps=1e-8, weight_decay=decay)

    def step(self):
        from tests.algorithms.test_muloco import reference_orthogonalise

        with torch.no_grad():
            for w, b in zip(self.matrices, self.buffers):
                b.mul_(self.mu).add_(w.grad)
                w.mul_(1 - self.eta * self.decay)
                scale = self.eta * max(1, w.shape[0] / w.shape[1]) ** 0.5
                w.sub_(scale * reference_orthogonalise(w.grad + self.mu * b))
        self.adamw.step()


@pytest.mark.parametrize("algorithm", ["sync", "local:period=1"])
def test_muon_on_the_mean_gradient_equals_the_reference(make_config, algorithm):
    # digits-mlp: two weight matrices (Muon) and two biases (AdamW)
    workers = 3 if algorithm == "sync" else 1
    r = Run(make_config(MUON, task="digits-mlp", algorithm=algorithm, workers=workers, steps=6))
    reference = torch_on_mean_gradient(r, 6, lambda p: _ReferenceMuon(p, lr=0.004, ratio=5, decay=0.1))
    for _ in range(6):
        r.train_step()
    torch.testing.assert_close(r.algorithm.eval_params(), reference, rtol=1e-4, atol=1e-5)


def test_muon_matrices_hidden_puts_the_output_layer_on_adamw(make_config):
    """``muon:matrices=hidden`` on digits-mlp: its first weight (hidden) on Muon, its last (the output
    layer) on AdamW with the biases, equal to the reference so divided; an unknown value is refused."""
    r = Run(make_config(MUON, task="digits-mlp", optimizer="muon:lr_ratio=5,matrices=hidden", workers=3, steps=6))
    assert r.model.roles == ("hidden", "vector", "output", "vector")
    assert [members for members, *_ in r.algorithm.opt.groups] == [[0]] and r.algorithm.opt.others == [1, 2, 3]
    reference = torch_on_mean_gradient(r, 6, lambda p: _ReferenceMuon(p, lr=0.004, ratio=5, decay=0.1,
                                                                      last_on_adamw=True))
    for _ in range(6):
        r.train_step()
    torch.testing.assert_close(r.algorithm.eval_params(), reference, rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match=r"matrices must be one of all, hidden, got 'some'"):
        Run(make_config(MUON, task="digits-mlp", optimizer="muon:matrices=some"))


@pytest.mark.parametrize("task", ["mnist1d-cnn", "digits-logreg"])
def test_muon_matrices_hidden_refuses_a_model_that_leaves_it_no_matrix(make_config, task):
    """The CNN's hidden weights are convolutions (not matrices) and its one Linear is the output layer;
    logistic regression's one weight is the output layer: Muon would update nothing, so one line says so."""
    with pytest.raises(ConfigError, match=r"matrices=hidden leaves Muon no matrix on this model.*matrices=all"):
        Run(make_config(MUON, task=task, optimizer="muon:matrices=hidden"))


def test_muon_options_reach_every_matrix(make_config):
    from gradwire.algorithms.muloco import Muon

    r = Run(make_config(MUON, task="digits-mlp", optimizer="muon:lr_ratio=5,ns_steps=3,ns_coefficients=polar-express"))
    opt = r.algorithm.opt
    # the two weights (10x64, 10x10 here: two shapes, two Muons), the two biases one AdamW
    assert [members for members, *_ in opt.groups] == [[0], [2]] and opt.others == [1, 3]
    assert all(isinstance(rule, Muon) and rule.ns == (3, "polar-express") for rule in opt.muons)


def test_muon_state_resumes_bitwise(make_config, tmp_path):
    cfg = dict(MUON, task="digits-mlp", steps=8, checkpoint_every=4, workers=3)
    run(make_config(cfg, out="whole"), progress=False)
    run(make_config(cfg, out="split", steps=6), progress=False)
    assert run(make_config(cfg, out="split", resume=True), progress=False)["resumed"]
    assert states_equal(final_checkpoint(tmp_path / "whole")["state"], final_checkpoint(tmp_path / "split")["state"])
    assert _holds_key(final_checkpoint(tmp_path / "whole")["state"], "buffer")  # Muon's momentum was compared


def _holds_key(state, key: str) -> bool:
    if isinstance(state, dict):
        return key in state or any(_holds_key(v, key) for v in state.values())
    return isinstance(state, list | tuple) and any(_holds_key(v, key) for v in state)


def test_checkpoint_names_a_changed_optimizer(make_config):
    base = dict(checkpoint_every=4, steps=4)
    run(make_config(ADAMW, base, out="a"), progress=False)
    with pytest.raises(ConfigError, match=r"optimizer: checkpoint 'adamw:beta2=0.95' vs now 'sgd'"):
        run(make_config(ADAMW, base, out="a", steps=8, optimizer="sgd", resume=True), progress=False)


@pytest.mark.parametrize(("flags", "message"), [
    (["--optimizer", "adam"], "unknown optimizer 'adam'; valid optimizers: adamw, muon, sgd"),
    (["--optimizer", "muon", "--momentum", "0.9"], "momentum=0.9 applies to --optimizer sgd"),
    (["--optimizer", "muon:lr_ratio=0"], "lr_ratio=0.0 must be a finite number > 0"),
    (["--optimizer", "muon:ns_steps=0"], "ns_steps must be >= 1, got 0"),
    (["--optimizer", "adamw:beta2=1.5"], "beta2=1.5 must be in [0, 1)"),
    (["--optimizer", "adamw", "--momentum", "0.9"], "momentum=0.9 applies to --optimizer sgd"),
    (["--optimizer", "adamw", "--algorithm", "diana"], "diana (heavy-ball momentum of its own on the master) "
                                                         "applies its own update rule"),
    (["--optimizer", "adamw", "--algorithm", "signsgd"], "signsgd (x <- x - γ·rank 0's reply) applies its own"),
    (["--optimizer", "adamw", "--algorithm", "diloco:inner_steps=1"], "its inner optimizer is the spec's inner="),
])
def test_bad_optimizer_input_is_one_line(tmp_path, data_dir, capsys, flags, message):
    code = main(["run", *flags, "--steps", "1", "--task", "digits-logreg", "--workers", "2",
                 "--out", str(tmp_path / "o"), "--data-dir", str(data_dir)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
