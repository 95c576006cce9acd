"""README.md: its two opening commands, its Python example (run here), no links that leave the
repository, and ``.ci/run`` calling the exact test command it gives."""

import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
README = open(os.path.join(ROOT, "README.md")).read()


def _code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def test_readme_opens_with_exactly_two_commands_and_ci_runs_the_test_command():
    first = _code_blocks("bash")[0].strip().splitlines()
    assert README.index("```bash") < README.index("\n## ") and len(first) == 2
    assert "--config fedavg_mnist" in first[0] and "pytest tests" in first[1]
    assert first[1].split("&& ")[-1] in open(os.path.join(ROOT, ".ci", "run")).read()


def test_readme_links_stay_inside_the_repository():
    assert "../" not in README and "http://" not in README and "https://" not in README
    for path in re.findall(
        r"`((?:fedjax_dp|experiments|benchmarks|colabs|tests)/[\w./-]+\.(?:py|md|ipynb))`", README
    ):
        assert os.path.exists(os.path.join(ROOT, path)), path


def test_the_python_api_example_runs_and_its_epsilon_is_the_accountants(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (example,) = [block for block in _code_blocks("python") if "fedjax_dp.Experiment(" in block]
    assert len(example.strip().splitlines()) <= 16
    namespace = {}
    exec(compile(example, "README.md:python-api", "exec"), namespace)
    summary, accountant = namespace["summary"], namespace["accountant"]
    assert summary.rounds == 10 and summary.formal is True
    assert summary.epsilon == pytest.approx(accountant.epsilon(1e-5), rel=1e-6)
    assert summary.epsilon == pytest.approx(4.0, abs=0.01)
    assert (tmp_path / "results" / "dp_quick" / "results.png").exists()


def test_the_correlated_noise_example_runs_blt_under_min_separation_at_its_epsilon(
    tmp_path, monkeypatch
):
    import json

    monkeypatch.chdir(tmp_path)
    (example,) = [block for block in _code_blocks("python") if '"dp.noise": "blt"' in block]
    namespace = {}
    exec(compile(example, "README.md:correlated-noise", "exec"), namespace)
    summary = namespace["blt_summary"]
    assert summary.rounds == 8 and summary.formal is True
    assert summary.epsilon == pytest.approx(4.0, abs=0.01)
    privacy = json.loads((tmp_path / "results" / "blt_quick" / "privacy.json").read_text())
    assert (
        privacy["accounting"]["noise_strategy"] == "blt"
        and privacy["accounting"]["prefix_sum_rmse_over_z_clip"] > 0
    )
