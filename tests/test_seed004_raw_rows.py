"""experiments/seed004_raw_rows.py: a run folder becomes its table row, its evaluations and a
per-round trace."""

import json

import pytest

from conftest import load_experiment


def _run_folder(out, folder, method=None):
    workdir = out / folder
    workdir.mkdir(parents=True)
    rows = [
        {"round": 0, "personalized_accuracy": 0.5, "epsilon": 0.0},
        {
            "round": 1,
            "cohort_size": 10,
            "train_loss": 1.5,
            "epsilon": 2.0,
            "uplink_gb_total": 0.1,
            "noise": 7,
        },
        {
            "round": 2,
            "cohort_size": 10,
            "train_loss": 1.2,
            "epsilon": 3.0,
            "uplink_gb_total": 0.2,
            "personalized_accuracy": 0.6,
        },
    ]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (workdir / "summary.json").write_text(
        json.dumps(
            {"rounds": 2, "uplink_gb": 0.2, "stop_reason": None, "seconds": 9.0, "backend": "gpu"}
        )
    )
    (workdir / "privacy.json").write_text(json.dumps({"epsilon": 3.0, "formal": True}))
    (workdir / "config.json").write_text(
        json.dumps(
            {
                "seed": 1,
                "model": {"name": "vgg16"},
                "client": {"learning_rate": 0.01, "batch_size": 50},
            }
        )
    )
    if method:
        (out / "rows.json").write_text(
            json.dumps([{"split": "acid3", "method": method, "workdir": str(workdir)}])
        )
    return workdir


def test_a_run_folder_becomes_its_row_evaluations_and_trace(tmp_path):
    raw = load_experiment("seed004_raw_rows")
    named = _run_folder(tmp_path / "a", "acid3-fixed_0_5", method="fixed 0.5")
    unnamed = _run_folder(tmp_path / "b", "alid5-FedAvg")
    out = tmp_path / "rows.json"
    raw.main([str(out), str(named), str(unnamed), "--setting", "test"])
    record = json.loads(out.read_text())
    first, second = record["runs"]
    assert record["setting"] == "test"
    assert (first["row"]["split"], first["row"]["method"], first["row"]["model"]) == (
        "acid3",
        "fixed 0.5",
        "vgg16",
    )
    # no rows.json: the folder's name
    assert (second["row"]["split"], second["row"]["method"]) == ("alid5", "FedAvg")
    assert (first["row"]["final"], first["row"]["best"], first["row"]["backend"]) == (
        0.6,
        0.6,
        "gpu",
    )
    # what --set changed
    assert first["config"] == {"seed": 1, "model.name": "vgg16", "client.learning_rate": 0.01}
    assert [e["round"] for e in first["evaluations"]] == [0, 2]
    assert first["rounds"] == [
        {"round": 1, "train_loss": 1.5, "epsilon": 2.0, "uplink_gb_total": 0.1},
        {"round": 2, "train_loss": 1.2, "epsilon": 3.0, "uplink_gb_total": 0.2},
    ]


def test_a_folder_without_a_summary_is_refused(tmp_path, capsys):
    raw = load_experiment("seed004_raw_rows")
    (tmp_path / "acid3-x").mkdir()
    with pytest.raises(SystemExit):
        raw.main([str(tmp_path / "out.json"), str(tmp_path / "acid3-x"), "--setting", "s"])
    assert "no summary.json" in capsys.readouterr().err and not (tmp_path / "out.json").exists()
