"""Every experiment script checks all of its runs before the first one loads data
(``experiments/preflight.py``): a bad argument or setting anywhere in a grid exits with the run's
name and the problem, nothing run and no output folder made."""

import sys

import pytest

from conftest import load_experiment


def _never(*args, **kwargs):
    pytest.fail("nothing may run")


@pytest.mark.parametrize(
    "script, argv, message",
    [
        ("local_vs_central", ["--epsilons", "1", "0"], "every target epsilon must be > 0, got 0"),
        ("local_vs_central", ["--epsilons", "1", "--seeds", "0", "-1"], "--seeds must be >= 0"),
        (
            "local_vs_central",
            ["--epsilons", "1", "--clip", "0"],
            "central-eps1: invalid configuration",
        ),
        ("seed002_tables", ["--set", "client.lr=1"], "the config has no key 'client.lr'"),
        ("seed002_tables", ["--set", "oops"], "write key=value"),
        (
            "seed002_tables",
            ["--methods", "fedavg", "uga", "--set", "client.learning_rate=-1"],
            "fedavg: invalid",
        ),
        ("seed004_fig7", ["--splits", "acid3", "acidq"], "split 'acidq'"),
        ("seed004_fig7", ["--rounds", "0"], "rounds must be >= 1, got 0"),
        ("geyer_table1", ["--clients", "100", "7"], "K must be one of [100, 1000, 10000], got 7"),
        ("geyer_table1", ["--max-rounds", "0"], "rounds must be >= 1, got 0"),
    ],
)
def test_a_bad_run_anywhere_stops_the_script_before_any_run(
    script, argv, message, monkeypatch, tmp_path, capsys
):
    module = load_experiment(script)
    for runner in ("run_experiment", "Experiment"):
        if hasattr(module, runner):
            monkeypatch.setattr(module, runner, _never)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv, "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_every_run_of_geyers_table_passes_the_preflight_including_the_non_private_reference(
    tmp_path,
):
    """The non-DP FedAvg reference at K = 100 kept the DP config's privacy section (Geyer's stop
    rule), which FedAvg does not read, so the preflight refused the whole grid; every variant of
    every K must validate."""
    module = load_experiment("geyer_table1")
    from fedjax_dp.training.config_validation import validate_config

    class Args:
        data_dir, max_rounds = str(tmp_path), 10

    for k in (100, 1000, 10000):
        for name, spec, overrides in module.variants(k, module.VARIANTS):
            # raises, naming the key, on a bad one
            validate_config(module.run_config(Args, spec, overrides))
