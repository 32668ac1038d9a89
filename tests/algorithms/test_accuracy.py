"""End-to-end: the MNIST-1D CNN trained by 8 simulated workers with sync SGD reaches >= 85% test
accuracy (the MNIST-1D paper reports 94% for this CNN trained alone; Greydanus 2020)."""

import pytest

from gradwire.config import RunConfig
from gradwire.run.loop import Run


@pytest.mark.slow
def test_mnist1d_cnn_sync_8_workers_reaches_85_percent(tmp_path, data_dir):
    r = Run(RunConfig(task="mnist1d-cnn", workers=8, algorithm="sync", steps=800, batch_size=32, lr=0.1,
                      momentum=0.9, seed=0, out=str(tmp_path), data_dir=str(data_dir)))
    for _ in range(800):
        r.train_step()
    acc = r.evaluate()["test_acc"]
    assert acc >= 0.85, acc
