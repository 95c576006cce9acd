"""Sweeps: the privacy cost of selecting the best run (Papernot and Steinke 2022) reproduced through
the project's own ledgers on TensorFlow Federated's DP tutorial setting; a grid sweep records every
run, picks the best, resumes without rerunning; a sweep past its budget is refused before any data
loads; the CLI's bad values are one line naming the option."""

from __future__ import annotations

import math
import re

import dp_accounting
import numpy as np
import pytest

from fedjax_dp.experiment import Experiment
from fedjax_dp.privacy.accounting import selection
from fedjax_dp.privacy.accounting.accountant import Accountant, RoundEvent
from fedjax_dp.training.privacy_plan import planned_run_event

DELTA = 1e-5
# TFF's DP tutorial: Poisson sampling of 50 of 3,383 clients, 100 rounds, z = 1.0
TFF = {
    "data.num_clients": 3383,
    "sampling.method": "poisson",
    "sampling.rate": 50 / 3383,
    "rounds": 100,
    "dp.noise_multiplier": 1.0,
    "privacy.target_epsilon": 0.0,
    "privacy.accountant": "rdp",
    "privacy.delta": DELTA,
}


@pytest.fixture(scope="module")
def tff_run():
    """One run's event and relation as the project's ledger composes the tutorial's config."""
    return planned_run_event(Experiment("dp_fedavg_mnist", TFF).config)


def test_the_ledger_composes_the_tutorial_run_as_100_poisson_sampled_gaussians(tff_run):
    event, relation = tff_run
    assert event == dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(50 / 3383, dp_accounting.GaussianDpEvent(1.0)), 100
    )
    assert relation == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def test_the_four_epsilons_of_the_tutorial_setting(tff_run):
    """Issue 89's numbers (dp_accounting 0.6, RDP, delta 1e-5): one run 1.503; the best of a
    Poisson(10) number of runs 2.513; ten runs composed 3.129; twenty 4.391."""
    event, relation = tff_run
    poisson = selection.selection_cost(event, DELTA, "poisson", 10, neighboring_relation=relation)
    assert round(poisson.single, 3) == 1.503
    assert round(poisson.selected, 3) == 2.513
    assert round(poisson.composed, 3) == 3.129 and poisson.num_runs == 10
    twenty = selection.selection_cost(event, DELTA, "fixed", 20, neighboring_relation=relation)
    assert round(twenty.selected, 3) == round(twenty.composed, 3) == 4.391
    assert "composition" in twenty.accounting and "RepeatAndSelect" in poisson.accounting
    # the truncated negative binomial (geometric, eta = 1) of the same mean costs more here
    geometric = selection.selection_cost(event, DELTA, "negative_binomial", 10, shape=1.0)
    assert poisson.selected < geometric.selected < poisson.composed


def test_an_accountant_and_a_ledger_give_the_same_run_event(tff_run):
    round_event = RoundEvent("poisson", 1.0, sampling_rate=50 / 3383)
    accountant = Accountant("rdp").compose(round_event, 60).compose(round_event, 40)
    assert selection.run_event(accountant) == tff_run[0]
    assert selection.run_event([(round_event, 100)]) == tff_run[0]


def test_runs_whose_settings_change_the_event_pay_the_worst_at_every_order():
    low, high = (
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(z)), 10
        )
        for z in (1.0, 2.0)
    )
    assert selection.worst_of([low, low]) == low
    worst = selection.worst_of([high, low])
    assert selection.rdp_epsilon(worst, DELTA) == pytest.approx(selection.rdp_epsilon(low, DELTA))
    assert selection.selection_cost(worst, DELTA).selected == pytest.approx(
        selection.selection_cost(low, DELTA).selected
    )


def test_the_number_of_runs_is_drawn_as_prescribed():
    rng = np.random.default_rng(0)
    poisson = [selection.draw_num_runs(rng, "poisson", 3.0) for _ in range(4000)]
    assert abs(np.mean(poisson) - 3.0) < 4 * math.sqrt(3.0 / 4000) and min(poisson) == 0
    for eta in (0.0, 0.5, 1.0, 3.0):
        draws = [selection.draw_num_runs(rng, "negative_binomial", 5.0, eta) for _ in range(4000)]
        assert min(draws) >= 1
        # the mean of 4000 heavy-tailed draws: within 4 standard errors of the sample's own
        assert abs(np.mean(draws) - 5.0) < 4 * np.std(draws) / math.sqrt(4000)
    assert selection.draw_num_runs(rng, "fixed", 4) == 4
    with pytest.raises(ValueError, match="runs='grid' unknown"):
        selection.draw_num_runs(rng, "grid", 4)
    with pytest.raises(ValueError, match="mean number of runs"):
        selection.selection_cost(dp_accounting.GaussianDpEvent(1.0), DELTA, "poisson", 0.5)


TINY = {
    "rounds": 2,
    "eval_every": 2,
    "model.name": "logistic",
    "sampling.rate": 0.05,
    "privacy.target_epsilon": 0.0,
}


def test_a_fixed_grid_records_every_run_picks_the_best_and_resumes_without_rerunning(tmp_path):
    import json
    import os

    import fedjax_dp

    def run():
        return fedjax_dp.sweep(
            "dp_fedavg_mnist",
            {"dp.clip_norm": [0.5, 1.0]},
            workdir=str(tmp_path / "sw"),
            runs="fixed",
            overrides=TINY,
            progress=False,
        )

    summary = run()
    saved = json.loads((tmp_path / "sw" / "sweep_summary.json").read_text())
    assert [r["settings"] for r in saved["runs"]] == [{"dp.clip_norm": 0.5}, {"dp.clip_norm": 1.0}]
    for r in saved["runs"]:
        own = json.loads((tmp_path / "sw" / f"run_{r['index']}" / "summary.json").read_text())
        assert r["metric"] == pytest.approx(own["final"]["test_accuracy"])
        assert r["epsilon"] == pytest.approx(own["epsilon"])
    metrics = [r["metric"] for r in saved["runs"]]
    assert metrics[0] != metrics[1] and saved["best"]["metric"] == max(metrics)
    privacy = saved["privacy"]
    assert privacy["method"] == "fixed grid: composition"
    assert privacy["selected_epsilon"] == pytest.approx(privacy["composed_epsilon"])
    assert privacy["selected_epsilon"] > privacy["single_run_epsilon"] > 0
    assert privacy["validation_data"] == "server-held data, no privacy cost"
    assert os.path.getsize(tmp_path / "sw" / "sweep.png") > 1000
    assert "released model" in summary.format()
    stamps = [os.path.getmtime(tmp_path / "sw" / f"run_{i}" / "summary.json") for i in (0, 1)]
    again = run()
    assert [os.path.getmtime(tmp_path / "sw" / f"run_{i}" / "summary.json") for i in (0, 1)] == (
        stamps
    )
    assert again.best == summary.best


def test_a_poisson_count_is_drawn_and_recorded_and_a_draw_of_none_releases_nothing(tmp_path):
    """With mean 1 a Poisson draw is 0 a third of the time: seed 2's is (checked), and no run is
    made; the selection's epsilon is still stated, and that nothing is released."""
    import fedjax_dp

    rng = np.random.default_rng(2)
    assert selection.draw_num_runs(rng, "poisson", 1.0) == 0
    summary = fedjax_dp.sweep(
        "dp_fedavg_mnist",
        {"dp.clip_norm": (0.1, 10.0, "log")},
        workdir=str(tmp_path / "none"),
        num_runs=1,
        seed=2,
        overrides=TINY,
        progress=False,
    )
    assert summary.runs == [] and summary.best is None and summary.draw["num_runs"] == 0
    assert "nothing is released" in " ".join(summary.privacy["notes"])
    assert summary.privacy["selected_epsilon"] > summary.privacy["single_run_epsilon"]


def test_a_sweep_past_its_budget_is_refused_before_any_data_loads(tmp_path):
    import fedjax_dp

    overrides = {**TINY, "data.source": "mnist", "data.data_dir": str(tmp_path / "no_data_here")}
    with pytest.raises(ValueError) as refused:
        fedjax_dp.sweep(
            "dp_fedavg_mnist",
            {"server.learning_rate": [0.5, 1.0]},
            workdir=str(tmp_path / "sw"),
            budget=1.0,
            overrides=overrides,
        )
    message = str(refused.value)
    assert message.startswith("sweep: budget=1.0: the released model would spend epsilon ")
    assert "RepeatAndSelectDpEvent" in message
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize(
    "items, message",
    [
        (["dp.clip_norm"], "--sweep=dp.clip_norm: give KEY=V1,V2,..."),
        (["dp.clip_norm=a,1"], "--sweep=dp.clip_norm=a,1: dp.clip_norm takes a number, got 'a'"),
        (["dp.clip_nrm=1,2"], "--sweep=dp.clip_nrm=1,2: unknown config key 'dp.clip_nrm'"),
        (["rounds=1,2.5"], "--sweep=rounds=1,2.5: rounds takes an integer, got '2.5'"),
        (["dp.clip_norm=1", "dp.clip_norm=2"], "--sweep=dp.clip_norm=2: dp.clip_norm is swept"),
    ],
)
def test_bad_sweep_values_are_one_line_naming_the_option_and_the_value(items, message):
    from fedjax_dp.cli import parse_sweep

    with pytest.raises(ValueError) as refused:
        parse_sweep(items, Experiment("dp_fedavg_mnist").config)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_sweep_values_take_their_keys_types_and_the_options_are_checked():
    from fedjax_dp.cli import parse_sweep, parse_sweep_options

    space = parse_sweep(
        ["dp.clip_norm=0.5, 1", "rounds=3,4", "data.source=mnist_5k"],
        Experiment("dp_fedavg_mnist").config,
    )
    assert space == {"dp.clip_norm": [0.5, 1.0], "rounds": [3, 4], "data.source": ["mnist_5k"]}
    assert parse_sweep_options("fixed", "", "2.5") == {"runs": "fixed", "budget": 2.5}
    assert parse_sweep_options("negative_binomial", "4", "", "test_loss", "min", "0.5") == {
        "runs": "negative_binomial",
        "num_runs": 4.0,
        "metric": "test_loss",
        "mode": "min",
        "shape": 0.5,
    }
    for args, message in (
        (("grid", "", ""), "--sweep_runs=grid: choose one of poisson, negative_binomial, fixed"),
        (("poisson", "", "", "test_loss", "lowest"), "--sweep_mode=lowest: choose one of max, min"),
        (
            ("poisson", "", "", "test_accuracy", "max", "-1"),
            "--sweep_shape=-1: give a number >= 0 (eta)",
        ),
        (
            ("poisson", "", "", "test_accuracy", "max", "1"),
            "--sweep_shape=1 is read only with --sweep_runs negative_binomial",
        ),
        (("poisson", "0.5", ""), "--sweep_num_runs=0.5: give a number >= 1 (runs)"),
        (("poisson", "", "-1"), "--sweep_budget=-1: give a positive epsilon"),
    ):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            parse_sweep_options(*args)


def test_the_cli_refuses_a_sweep_past_its_budget_in_one_line_before_any_run(tmp_path):
    import os
    import subprocess
    import sys

    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedjax_dp",
            "--config=dp_fedavg_mnist",
            "--noprogress",
            "--config.privacy.target_epsilon=0",
            "--sweep=dp.clip_norm=0.5,1",
            "--sweep_budget=1.5",
            f"--workdir={tmp_path / 'sw'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": repository},
    )
    assert out.returncode == 2
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: sweep: budget=1.5: the released model would spend epsilon ")
    assert "loading data" not in out.stderr and not (tmp_path / "sw" / "run_0").exists()


def test_a_sweep_whose_event_needs_the_data_is_accounted_after_its_runs(tmp_path, monkeypatch):
    """Where a run's event is known only once its data loads (no plan before the runs), the
    selection is accounted from the events the runs' trackers composed: the same figures as the
    plan gives where there is one."""
    import fedjax_dp
    from fedjax_dp import sweeps

    def run(workdir):
        return fedjax_dp.sweep(
            "dp_fedavg_mnist",
            {"dp.clip_norm": [0.5, 1.0]},
            workdir=str(tmp_path / workdir),
            runs="fixed",
            overrides=TINY,
            progress=False,
        )

    planned = run("planned").privacy
    monkeypatch.setattr(sweeps, "planned_run_event", lambda cfg: None)
    after = run("after").privacy
    assert any("after the runs" in note for note in after["notes"])
    for key in ("single_run_epsilon", "selected_epsilon", "composed_epsilon"):
        assert after[key] == pytest.approx(planned[key], rel=1e-9)


def test_a_vectorized_sweep_equals_the_sweep_run_by_run(tmp_path, monkeypatch):
    """A grid over the clip norm and the server learning rate as one vmapped program: each run's
    metric its run alone's up to float32 rounding, the same selection accounted; a key one program
    cannot take is refused before any run."""
    import fedjax_dp
    from fedjax_dp.training import run_batch

    built, original = [], run_batch._program
    monkeypatch.setattr(run_batch, "_program", lambda *a: built.append(1) or original(*a))

    def run(name, vectorized, grid=None):
        return fedjax_dp.sweep(
            "dp_fedavg_mnist",
            grid or {"dp.clip_norm": [0.5, 1.0], "server.learning_rate": [0.5, 1.0]},
            workdir=str(tmp_path / name),
            runs="fixed",
            overrides=TINY,
            vectorized=vectorized,
            progress=False,
        )

    alone, together = run("alone", False), run("together", True)
    assert built == [1]
    assert [r["settings"] for r in alone.runs] == [r["settings"] for r in together.runs]
    np.testing.assert_allclose(
        [r["metric"] for r in together.runs], [r["metric"] for r in alone.runs], rtol=2e-5
    )
    assert [r["epsilon"] for r in together.runs] == [r["epsilon"] for r in alone.runs]
    assert together.privacy["selected_epsilon"] == alone.privacy["selected_epsilon"]
    assert len({r["metric"] for r in alone.runs}) > 1
    with pytest.raises(ValueError, match="differs from config 0 in client.epochs: 2"):
        run("epochs", True, {"client.epochs": [1, 2]})
    assert not (tmp_path / "epochs").exists()
