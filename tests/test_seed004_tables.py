"""experiments/seed004_tables.py: every Table 2 variant is a valid config (refused before any data
is loaded otherwise), and Table 1 reads the epsilon recorded when each target accuracy was first
reached."""

import json
import os
import sys
from types import SimpleNamespace

import pytest

from conftest import load_experiment
from fedjax_dp.training.config_validation import validate_config


@pytest.fixture(scope="module")
def tables():
    return load_experiment("seed004_tables")


@pytest.mark.parametrize("table", [2, 3, 5, 6, 7, 8])
def test_every_variant_is_a_valid_config(tables, table):
    args = SimpleNamespace(
        rounds=20, seed=0, eval_every=0, source="cifar10", data_dir="/data/cifar10"
    )
    variants = tables.table_variants(table)
    assert variants
    for name, overrides in variants:
        validate_config(tables.configure(args, {**tables.split_overrides("acid3"), **overrides}))


def test_table1_gives_the_epsilon_when_each_baselines_best_accuracy_was_first_reached(
    tables, tmp_path
):
    def run(name, accuracies, epsilons, formal=True):
        workdir = tmp_path / name
        workdir.mkdir()
        with open(workdir / "metrics.jsonl", "w") as f:
            for t, (acc, eps) in enumerate(zip(accuracies, epsilons)):
                f.write(json.dumps({"round": t, "client_accuracy": acc, "epsilon": eps}) + "\n")
        return {
            "split": "acid3",
            "method": name,
            "metric": "client_accuracy",
            "best": max(accuracies),
            "epsilon": epsilons[-1],
            "formal": formal,
            "workdir": str(workdir),
        }

    rows = [
        run("CUAG-PFL", [0.1, 0.5, 0.7], [0.0, 0.3, 0.6]),
        run("UDP (paper)", [0.1, 0.3, 0.2], [0.0, 4.0, 8.0], formal=False),
        run("DP-SCAFFOLD", [0.1, 0.2, 0.5], [0.0, 10.0, 20.0]),
    ]
    table = tables.table1_markdown(rows).splitlines()
    assert table[0] == "| split | method | epsilon at 0.3000 | epsilon at 0.5000 |"
    assert table[2] == "| acid3 | CUAG-PFL | 0.300 | 0.300 |"
    assert table[3] == "| acid3 | UDP (paper) | 4.000 (no formal guarantee) | not reached |"
    assert table[4] == "| acid3 | DP-SCAFFOLD | 20.000 | 20.000 |"


def test_resume_continues_a_checkpointed_row_and_starts_the_others_afresh(
    tables, tmp_path, monkeypatch, capsys
):
    import numpy as np

    from fedjax_dp.training.checkpointing import Checkpointer

    calls = []

    # writes what a finished run leaves behind
    def fake_run(cfg, workdir, overwrite, progress, resume):
        calls.append((os.path.basename(workdir), cfg.checkpoint_every, overwrite, resume))
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
            for t, acc in [(0, 0.4), (5, 0.7), (10, 0.6)]:
                f.write(json.dumps({"round": t, "personalized_accuracy": acc}) + "\n")
            for t, dropped in [(9, 3), (10, 10)]:  # non-finite updates: the row must say so
                f.write(
                    json.dumps({"round": t, "cohort_size": 10, "dropped_clients": dropped}) + "\n"
                )
        json.dump(
            {
                "rounds": 10,
                "uplink_gb": 0.5,
                "stop_reason": None,
                "seconds": 12.34,
                "client_updates": 100,
            },
            open(os.path.join(workdir, "summary.json"), "w"),
        )
        json.dump(
            {"epsilon": 3.0, "formal": True}, open(os.path.join(workdir, "privacy.json"), "w")
        )
        json.dump(cfg.to_dict(), open(os.path.join(workdir, "config.json"), "w"))

    monkeypatch.setattr(tables, "run_experiment", fake_run)
    args = SimpleNamespace(
        rounds=10,
        seed=0,
        eval_every=0,
        source="cifar10",
        data_dir="/data/cifar10",
        out=str(tmp_path),
        set=[],
        checkpoint_every=5,
        resume=True,
    )
    Checkpointer(str(tmp_path / "acid3-block" / "checkpoints")).save(5, {"x": np.zeros(2)}, {})
    # a run killed before its first checkpoint: said, then started again
    os.makedirs(tmp_path / "acid3-gaussian")
    (tmp_path / "acid3-gaussian" / "metrics.jsonl").write_text('{"round": 0}\n')
    block = tables.run(
        args, tables.run_config(args, "acid3", {"compression.kind": "block"}), "acid3", "block"
    )
    fresh = tables.run(
        args,
        tables.run_config(args, "acid3", {"compression.kind": "gaussian"}),
        "acid3",
        "gaussian",
    )
    assert calls == [("acid3-block", 5, False, True), ("acid3-gaussian", 5, True, False)]
    assert (
        capsys.readouterr().out.count("has no checkpoint; its run starts again from round 0") == 1
    )
    assert (block["resumed"], fresh["resumed"]) == (True, False)
    assert (block["final"], block["best"], block["metric"]) == (0.6, 0.7, "personalized_accuracy")
    assert block["uplink_gb_300_rounds"] == pytest.approx(15.0) and block["epsilon"] == 3.0
    assert block["model"] == "cnn_pfl"
    assert (block["dropped_updates"], block["client_updates"]) == (13, 100)
    assert "0.6000 / 0.7000 (13 of 100 updates dropped)" in tables.markdown([block])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--table", "4"], "--table 4 unknown"),
        (["--table", "2", "--only", "nothing"], "matches no variant of table 2"),
        (["--table", "6", "--splits", "acidx"], "split 'acidx': use acidN or alidN"),
        # the second split: before the first runs
        (["--table", "6", "--splits", "acid3", "alid0"], "alid0 / dynamic"),
        (["--table", "3", "--mus", "8", "0"], "cuag.mu must be > 0, got 0.0"),
        (["--table", "6", "--set", "model.nme=vgg16"], "the config has no key 'model.nme'"),
        (["--table", "6", "--set", "model.name=vgg17"], "vgg17"),
        (
            ["--table", "6", "--set", "client.batch_size=0.5"],
            "client.batch_size takes a value of type int, got '0.5'",
        ),
    ],
)
def test_every_run_is_planned_and_checked_before_the_first_one(
    tables, monkeypatch, tmp_path, capsys, argv, message
):
    monkeypatch.setattr(tables, "run", lambda *a: pytest.fail("nothing may run"))
    monkeypatch.setattr(sys, "argv", ["seed004_tables.py", *argv, "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit):
        tables.main()
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "only, expected",
    [
        (["SCAFFOLD"], ["SCAFFOLD"]),  # a whole name: that variant alone, not DP-SCAFFOLD's rows
        (
            ["DP-SCAFFOLD"],
            ["DP-SCAFFOLD (median clip, sigma 1)", "DP-SCAFFOLD (fixed clip 1, sigma 1)"],
        ),
        (
            ["UDP", "FedAvg"],
            ["FedAvg", "UDP (paper calibration, epsilon 10)", "UDP (sound, epsilon 10)"],
        ),
    ],
)
def test_only_selects_a_whole_name_alone_and_a_part_of_names_all_that_contain_it(
    tables, only, expected
):
    args = SimpleNamespace(
        table=2,
        only=only,
        splits=["acid3"],
        rounds=3,
        seed=0,
        eval_every=0,
        source="cifar10",
        data_dir="/data/cifar10",
        checkpoint_every=10,
        mus=tables.PAPER_MUS,
        set=[],
    )
    assert [name for *_, name in tables.plan_runs(args)] == expected


def test_table3_runs_the_mu_values_asked_for_at_the_evaluation_interval_asked_for(tables):
    args = SimpleNamespace(
        table=3,
        only=["sound mode"],
        mus=[8.0, 64.0],
        splits=["acid3"],
        rounds=3,
        seed=0,
        eval_every=7,
        source="cifar10",
        data_dir="/data/cifar10",
        checkpoint_every=10,
        set=[],
    )
    runs = tables.plan_runs(args)
    assert [name for *_, name in runs] == ["sound mode, mu 8.0", "sound mode, mu 64.0"]
    assert [(cfg.cuag.mode, cfg.cuag.mu, cfg.eval_every) for _, cfg, *_ in runs] == [
        ("sound", 8.0, 7),
        ("sound", 64.0, 7),
    ]


def test_set_overrides_every_variant_last(tables):
    """Tables 4 and 6's VGG16 rows: ``--set model.name=vgg16`` reaches every variant, after the
    variant's own overrides (here Table 2's SCAFFOLD row, which names cnn_pfl itself)."""
    args = SimpleNamespace(
        table=2,
        only=["SCAFFOLD", "FedAvg"],
        splits=["acid3"],
        rounds=3,
        seed=0,
        eval_every=0,
        source="cifar10",
        data_dir="/data/cifar10",
        checkpoint_every=10,
        mus=tables.PAPER_MUS,
        set=["model.name=vgg16", "engine.unroll=1"],
    )
    runs = tables.plan_runs(args)
    assert [(name, cfg.model.name, cfg.engine.unroll) for *_, cfg, _, name in runs] == [
        ("SCAFFOLD", "vgg16", "1"),
        ("FedAvg", "vgg16", "1"),
    ]
