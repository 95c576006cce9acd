"""The main command: config overrides reach the run, results are written, bad configs are refused."""

import json
import os
import subprocess
import sys

import pytest
from ml_collections import config_flags  # noqa: F401  (import check)

ROOT = os.path.join(os.path.dirname(__file__), "..")
CONFIG = os.path.join(ROOT, "experiments", "configs", "fedavg_mnist.py")


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "fedjax_dp.cli", f"--config={CONFIG}", "--noprogress", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600)


def test_overrides_reach_the_run_and_results_are_written(tmp_path):
    out = run_cli("--config.rounds=3", "--config.eval_every=2", "--config.model.name=logistic",
                  "--config.sampling.cohort_size=4", f"--workdir={tmp_path}/run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["cohort_size"] == 4 for r in rows) and rows[-1]["client_updates"] == 12
    assert "test_accuracy" in rows[1] and "test_accuracy" not in rows[0]
    assert json.load(open(tmp_path / "run" / "config.json"))["model"]["name"] == "logistic"
    assert os.path.getsize(tmp_path / "run" / "accuracy.png") > 1000
    assert "best accuracy" in out.stdout
    again = run_cli("--config.rounds=1", f"--workdir={tmp_path}/run", cwd=tmp_path)
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_invalid_config_lists_every_error(tmp_path):
    out = run_cli("--config.rounds=0", "--config.client.batch_size=0", "--config.sampling.cohort_size=500",
                  f"--workdir={tmp_path}/bad", cwd=tmp_path)
    assert out.returncode == 2
    for fragment in ("rounds must be >= 1, got 0", "client.batch_size must be >= 1, got 0",
                     "sampling.cohort_size must lie in [1, data.num_clients=100], got 500"):
        assert fragment in out.stderr
    assert not os.path.exists(tmp_path / "bad")
