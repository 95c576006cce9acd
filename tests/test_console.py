"""What a run says while it runs where its output is not a terminal (a log file, a pipe, a
notebook cell) or with ``--noprogress``: a line per slow phase, the noise and the epsilon it will
spend before the first round, a line per evaluation, and no progress-bar frames."""

from __future__ import annotations

import json

from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment


def _tiny_dp_config():
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = "dp_fedavg", 4, 2
    c.data.num_clients, c.model.name, c.sampling.cohort_size = 12, "logistic", 4
    c.client.update(epochs=1, batch_size=20)
    return c


def test_without_a_terminal_a_run_prints_its_phases_its_privacy_plan_and_each_evaluation(
    tmp_path, capsys
):
    """It printed nothing until the end (4 minutes on dp_fedavg_mnist under load), and in a log
    file the bar wrote a frame per round; a run at privacy.target_epsilon = 0 spent its epsilon at
    the configured z without saying so."""
    run_experiment(_tiny_dp_config(), str(tmp_path / "w"), progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    spent = json.load(open(tmp_path / "w" / "privacy.json"))["epsilon"]
    plan = next(line for line in lines if line.startswith("privacy: "))
    assert "z = 1, S = 1 as configured (privacy.target_epsilon = 0: not calibrated)" in plan
    assert f"4 rounds will spend epsilon {spent:.4g} at delta 1e-05" in plan
    assert (
        lines.index(plan)
        < lines.index("compiling and running the first evaluation and round")
        < [i for i, line in enumerate(lines) if line.startswith("round 0/4: test_accuracy")][0]
    )
    assert any(line.startswith("loading data: mnist_5k") for line in lines[: lines.index(plan)])
    assert [line.split(":")[0] for line in lines if line.startswith("round ")] == [
        "round 0/4",
        "round 2/4",
        "round 4/4",
    ]
    assert lines[-1].startswith("round 4/4: test_accuracy") and f"epsilon {spent:.4g}" in lines[-1]


def test_progress_false_prints_nothing(tmp_path, capsys):
    run_experiment(_tiny_dp_config(), str(tmp_path / "w"), progress=False)
    assert capsys.readouterr().err == ""


def test_on_a_terminal_the_privacy_plan_is_the_first_line(tmp_path, capsys):
    """``--config dp_fedavg_mnist --config.privacy.target_epsilon=0`` spent epsilon 9.08 at z = 1
    without a word; beside the bar the slow phases are not announced, so the plan comes first."""
    run_experiment(_tiny_dp_config(), str(tmp_path / "w"), progress="bar")
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("privacy: z = 1, S = 1 as configured") and "will spend epsilon" in first
