"""The correlated-noise experiment scripts: every run of ``experiments/correlated_noise.py``'s grid
(the non-private and clip-only ceilings, every method, FEMNIST's overrides) validates before data,
with delta = 1/N^1.1 where asked; and ``experiments/strategy_errors.py`` reports the identity's
prefix-sum noise in closed form."""

import json
import math
import sys
from types import SimpleNamespace

import pytest
from conftest import load_experiment

from fedjax_dp.training.config_validation import validate_config


def grid_args(**changes):
    args = dict(
        epsilons=[2.0, 8.0],
        methods=None,
        seeds=[0],
        rounds=100,
        clients=105,
        cohort=20,
        separation=5,
        check_in_rate=0.5,
        batch=16,
        clip=0.5,
        delta=0.0,
        non_private=True,
        clip_only=True,
        set=["data.source=femnist", "data.partition=natural", "model.name=mlp_2nn"],
    )
    args.update(changes)
    return SimpleNamespace(**args)


def test_every_run_of_the_grid_validates_and_delta_zero_means_one_over_n_to_the_1_1():
    module = load_experiment("correlated_noise")
    runs = list(module.plan(grid_args(methods=list(module.METHODS))))
    assert [r[0] for r in runs][:2] == list(module.REFERENCES) and len(runs) == 2 + 2 * len(
        module.METHODS
    )
    for name, cfg, eps, method in runs:
        validate_config(cfg)  # raises, naming the key, on a bad one
        if method == module.NON_PRIVATE:
            assert cfg.algorithm == "fedavg" and cfg.sampling.method == "uniform"
        elif method == module.CLIP_ONLY:  # the clip of the DP runs, no noise
            assert (
                cfg.algorithm == "dp_fedavg"
                and cfg.dp.noise_multiplier == 0
                and cfg.dp.clip_norm == 0.5
            )
        else:
            assert (
                cfg.privacy.delta == pytest.approx(1 / 105**1.1)
                and cfg.privacy.target_epsilon == eps
            )
            assert cfg.sampling.method == (
                "poisson" if method == "dp_fedavg_poisson" else "min_separation"
            )


def test_strategy_errors_gives_the_identitys_prefix_noise_in_closed_form(
    tmp_path, monkeypatch, capsys
):
    """Identity under 3-min-separation over 12 rounds: sens = sqrt(4) and ||(A C^{-1})[t]|| =
    sqrt(t), so the RMSE over z S is 2 sqrt(mean t) = 2 sqrt(6.5), the largest 2 sqrt(12), and each
    round's own noise 2."""
    module = load_experiment("strategy_errors")
    out = tmp_path / "errors.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "strategy_errors.py",
            "--rounds",
            "12",
            "--participation",
            "min_separation",
            "--separation",
            "3",
            "--strategies",
            "identity",
            "tree",
            "tree_honaker",
            "banded",
            "--out",
            str(out),
        ],
    )
    module.main()
    rows = {r["strategy"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["identity"]["sensitivity"] == pytest.approx(2.0)
    assert rows["identity"]["prefix_sum_rmse_over_z_clip"] == pytest.approx(2 * math.sqrt(6.5))
    assert rows["identity"]["prefix_sum_max_error_over_z_clip"] == pytest.approx(2 * math.sqrt(12))
    # each round: one unit draw
    assert rows["identity"]["per_round_rmse_over_z_clip"] == pytest.approx(2.0)
    assert (
        rows["banded"]["prefix_sum_rmse_over_z_clip"]
        < rows["identity"]["prefix_sum_rmse_over_z_clip"]
    )
    assert "| banded |" in capsys.readouterr().out
