"""experiments/prototype_lr_probe.py: the central prototype-loss probe that chose the VGG16 rows'
learning rates."""

import numpy as np
import pytest

from conftest import load_experiment


def _three_blobs(n=600, seed=0):
    """Three classes of 32x32x3 images whose means differ a little: the untrained CNN's prototypes
    separate them only partly (accuracy 0.58), a few steps of training fully."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n).astype(np.int32)
    x = 0.5 + 0.1 * rng.standard_normal((n, 32, 32, 3)).astype(np.float32)
    x[:, :16] += 0.05 * (y[:, None, None, None] == 1)
    x[:, 16:] += 0.05 * (y[:, None, None, None] == 2)
    return x, y


def test_the_probe_reports_every_k_steps_and_a_learnable_task_is_learned():
    probe = load_experiment("prototype_lr_probe")
    rows = probe.probe(*_three_blobs(), "cnn_pfl", learning_rate=0.5, steps=20, every=10)
    assert [r["step"] for r in rows] == [0, 10, 20]
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in rows)
    assert (
        rows[0]["accuracy"] < 0.7
        and rows[-1]["accuracy"] >= 0.9
        and rows[-1]["loss"] < rows[0]["loss"]
    )


def test_bad_arguments_are_refused_before_any_data_is_read(capsys):
    probe = load_experiment("prototype_lr_probe")
    with pytest.raises(SystemExit):
        probe.main(["--learning-rate", "0", "--data-dir", "/nonexistent"])
    assert "--learning-rate must be > 0" in capsys.readouterr().err
