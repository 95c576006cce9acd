"""experiments/seed003_figure.py: reads both committed row formats, keeps only the asked seed, and draws
one panel per --panel."""

import json
import sys

import pytest

from conftest import load_experiment


@pytest.fixture(scope="module")
def figure():
    return load_experiment("seed003_figure")


def row(method, epsilon, accuracy, **extra):
    return {"run": f"{method}-eps{epsilon}", "method": method, "epsilon": epsilon, "accuracy": accuracy, **extra}


def test_rows_of_one_seed_from_both_formats(figure, tmp_path):
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"setting": "s", "rows": [row("ldp", 1, 0.3), row("ldp", 8, 0.6, seed=1)]}))
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"runs": {
        "a": {"args": {"seed": 0}, "rows": [row("ldp_fixed", 1, 0.5)]},
        "b": {"args": {"seed": 2}, "rows": [row("ldp_fixed", 1, 0.4)]}}}))
    assert [r["accuracy"] for r in figure.load_rows(str(flat), 0)] == [0.3]
    assert [r["accuracy"] for r in figure.load_rows(str(flat), 1)] == [0.6]
    assert [r["accuracy"] for r in figure.load_rows(str(runs), 0)] == [0.5]
    assert [r["accuracy"] for r in figure.load_rows(str(runs), 2)] == [0.4]


def test_draws_a_panel_per_dataset(figure, tmp_path, monkeypatch):
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"rows": [row("fedavg", None, 0.9), row("ldp", 1, 0.3), row("ldp", 4, 0.5)]}))
    out = tmp_path / "fig.png"
    monkeypatch.setattr(sys, "argv", ["seed003_figure.py", "--panel", "A", str(rows), "--panel", "B", str(rows),
                                      "--out", str(out)])
    figure.main()
    assert out.stat().st_size > 1000
    with pytest.raises(SystemExit):
        monkeypatch.setattr(sys, "argv", ["seed003_figure.py", "--panel", "only a title", "--out", str(out)])
        figure.main()
