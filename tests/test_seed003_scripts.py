"""experiments/seed003_ldp.py checks every run's config before the first loads data, and keeps its
rows after every run; experiments/seed003_figure.py reads both committed row formats, keeps only the
asked seed, and draws one panel per --panel."""

import json
import sys

import pytest

from conftest import load_experiment


@pytest.fixture(scope="module")
def ldp_script():
    return load_experiment("seed003_ldp")


@pytest.fixture(scope="module")
def figure():
    return load_experiment("seed003_figure")


def row(method, epsilon, accuracy, **extra):
    return {
        "run": f"{method}-eps{epsilon}",
        "method": method,
        "epsilon": epsilon,
        "accuracy": accuracy,
        **extra,
    }


def test_rows_of_one_seed_from_both_formats(figure, tmp_path):
    flat = tmp_path / "flat.json"
    flat.write_text(
        json.dumps({"setting": "s", "rows": [row("ldp", 1, 0.3), row("ldp", 8, 0.6, seed=1)]})
    )
    runs = tmp_path / "runs.json"
    runs.write_text(
        json.dumps(
            {
                "runs": {
                    "a": {"args": {"seed": 0}, "rows": [row("ldp_fixed", 1, 0.5)]},
                    "b": {"args": {"seed": 2}, "rows": [row("ldp_fixed", 1, 0.4)]},
                }
            }
        )
    )
    assert [r["accuracy"] for r in figure.load_rows(str(flat), 0)] == [0.3]
    assert [r["accuracy"] for r in figure.load_rows(str(flat), 1)] == [0.6]
    assert [r["accuracy"] for r in figure.load_rows(str(runs), 0)] == [0.5]
    assert [r["accuracy"] for r in figure.load_rows(str(runs), 2)] == [0.4]


def test_draws_a_panel_per_dataset(figure, tmp_path, monkeypatch):
    rows = tmp_path / "rows.json"
    rows.write_text(
        json.dumps({"rows": [row("fedavg", None, 0.9), row("ldp", 1, 0.3), row("ldp", 4, 0.5)]})
    )
    out = tmp_path / "fig.png"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "seed003_figure.py",
            "--panel",
            "A",
            str(rows),
            "--panel",
            "B",
            str(rows),
            "--out",
            str(out),
        ],
    )
    figure.main()
    assert out.stat().st_size > 1000
    with pytest.raises(SystemExit):
        monkeypatch.setattr(
            sys, "argv", ["seed003_figure.py", "--panel", "only a title", "--out", str(out)]
        )
        figure.main()


def test_every_planned_run_is_a_valid_config_in_the_documented_order(ldp_script):
    from fedjax_dp.training.config_validation import validate_config

    args = ldp_script.parser().parse_args(
        ["--epsilons", "1", "4", "--alphas", "0.5", "--taus", "0"]
    )
    runs = ldp_script.plan_runs(args)
    assert [name for name, _, _ in runs] == ["fedavg"] + [
        f"{m}-eps{e}" for e in (1, 4) for m in ldp_script.METHODS[1:]
    ] + ["ldp-alpha0.5", "ldp-tau0"]
    for _, cfg, _ in runs:
        validate_config(cfg)


def test_a_bad_run_anywhere_in_the_grid_stops_the_script_before_any_run(
    ldp_script, monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(ldp_script, "run", lambda *a: pytest.fail("nothing may run"))
    for argv, message in (
        (["--epsilons", "1", "-1"], "every per-client epsilon must be > 0, got -1"),
        (["--epsilons", "1", "--gamma", "0"], "fedavg: invalid configuration"),
    ):
        monkeypatch.setattr(sys, "argv", ["seed003_ldp.py", *argv, "--out", str(tmp_path / "out")])
        with pytest.raises(SystemExit):
            ldp_script.main()
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_rows_of_finished_runs_are_kept_when_a_later_run_fails(
    ldp_script, monkeypatch, tmp_path
):
    done = []

    def fake_run(name, cfg, args, extra):
        if done:
            raise RuntimeError("the second run dies")
        done.append(name)
        return {"run": name, **extra, "accuracy": 0.5}

    monkeypatch.setattr(ldp_script, "run", fake_run)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "seed003_ldp.py",
            "--epsilons",
            "1",
            "--methods",
            "ldp",
            "ldp_mean",
            "--alphas",
            "--taus",
            "--out",
            str(tmp_path),
        ],
    )
    with pytest.raises(RuntimeError):
        ldp_script.main()
    assert [r["run"] for r in json.loads((tmp_path / "rows.json").read_text())["rows"]] == [
        "ldp-eps1"
    ]


def test_the_seeds_summary_pairs_each_difference_by_seed_with_a_t_interval(tmp_path):
    """experiments/seed003_seeds.py: a method's mean and 95 % t half-width over seeds, and each
    claim's paired difference taken within a seed (the interval of the differences, not of the two
    means)."""
    seeds = load_experiment("seed003_seeds")
    rows = {
        "runs": {
            "a": {"args": {"seed": 0}, "rows": [row("ldp", 1, 0.30), row("ldp_fixed", 1, 0.50)]},
            "b": {
                "args": {"seed": 1},
                "rows": [row("ldp", 1, 0.40), row("ldp_fixed", 1, 0.58), row("ldp_mean", 1, 0.45)],
            },
            "c": {"args": {"seed": 2}, "rows": [row("ldp", 1, 0.20), row("ldp_fixed", 1, 0.42)]},
        }
    }
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    summary = seeds.main([str(path)])[1.0]
    mean, half, n = summary["ldp"]
    assert (
        n == 3
        and mean == pytest.approx(0.30)
        and half == pytest.approx(4.302653 * 0.1 / 3**0.5, rel=1e-5)
    )
    mean, half, n, differences = summary["ldp_fixed - ldp"]
    assert differences == pytest.approx([0.20, 0.18, 0.22]) and mean == pytest.approx(0.20)
    # far narrower than either method's spread
    assert half == pytest.approx(4.302653 * 0.02 / 3**0.5, rel=1e-5)
    assert summary["ldp_mean - ldp"][2] == 1  # only seed 1 ran the plain mean
    rows["runs"]["c"]["rows"].append(row("ldp", 1, 0.25))
    path.write_text(json.dumps(rows))
    with pytest.raises(ValueError, match="two rows for ldp at epsilon 1, seed 2"):
        seeds.main([str(path)])


def test_the_alpha_summary_pairs_each_alpha_with_alpha_one_and_with_the_plain_mean_by_seed(
    tmp_path,
):
    """``experiments/seed003_alpha.py``: per (partition, epsilon, alpha) the means, the history
    term's paired difference against alpha = 1 and the correlation weighting's against the plain
    mean, both by seed."""
    alpha_script = load_experiment("seed003_alpha")
    documents = []
    for seed, (at_one, at_half, mean_half) in enumerate(
        [(0.60, 0.50, 0.55), (0.70, 0.62, 0.66), (0.65, 0.55, 0.61)]
    ):
        for alpha, ldp, plain in ((1.0, at_one, at_one + 0.02), (0.5, at_half, mean_half)):
            documents.append(
                {
                    "args": {"partition": "shards", "alpha": alpha, "seed": seed},
                    "rows": [row("ldp", 4.0, ldp), row("ldp_mean", 4.0, plain)],
                }
            )
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"runs": documents}))
    rows = {r["alpha"]: r for r in alpha_script.main([str(path)])}
    assert (
        rows[0.5]["history"][0] == pytest.approx(-0.0933, abs=1e-4) and rows[0.5]["history"][2] == 3
    )
    assert rows[0.5]["correlation"][0] == pytest.approx(-0.05) and rows[1.0]["history"] is None
    assert rows[1.0]["correlation"][0] == pytest.approx(-0.02)
    with pytest.raises(ValueError, match="two rows"):
        alpha_script.accuracies(documents + documents[:1])
