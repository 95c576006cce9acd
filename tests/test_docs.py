"""The documentation site: it builds offline with warnings as errors (a broken reference fails
here), renders every notebook with its saved outputs, documents every public name, and its code
examples and the public functions' docstring examples (doctests) run."""

import doctest
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOCS = os.path.join(ROOT, "docs")
SUBPACKAGES = (
    "fedjax_dp",
    "fedjax_dp.core",
    "fedjax_dp.algorithms",
    "fedjax_dp.privacy",
    "fedjax_dp.data",
    "fedjax_dp.models",
    "fedjax_dp.compression",
    "fedjax_dp.hypergrad",
    "fedjax_dp.training",
)
DOCTESTED = {
    "fedjax_dp.experiment": 2,
    "fedjax_dp.core.uploads": 2,
    "fedjax_dp.privacy.accounting.accountant": 2,
    "fedjax_dp.privacy.sampling.poisson": 2,
    "fedjax_dp.privacy.accounting.calibration": 1,
    "fedjax_dp.privacy.accounting.selection": 1,
    "fedjax_dp.privacy.accounting.gdp": 3,
    "fedjax_dp.data.partition": 2,
}
"""Modules whose docstring examples the suite runs, with the least number of examples each must
hold."""


def build(out) -> None:
    """The site, built from scratch (``-E``) the way README.md says, warnings as errors."""
    env = {**os.environ, "FEDJAX_DP_CPU_DEVICES": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-E",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            DOCS,
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def test_the_docs_build_command_is_the_one_the_readme_gives():
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "python3 -m sphinx -W --keep-going -b html docs docs/_build/html" in readme


def test_the_site_builds_without_a_warning_renders_the_notebooks_and_documents_every_public_name(
    tmp_path,
):
    """One build (about half a minute) checked three ways: every page exists, every notebook is
    rendered with its saved outputs (never executed here), and every public callable of each
    subpackage's ``__all__`` has an entry."""
    build(tmp_path)
    for name in (
        "index",
        "getting_started",
        "concepts",
        "privacy",
        "correlated_noise",
        "cohort_engine",
        "measurements",
        "adding_an_algorithm",
        "distributed",
        "scorecard",
        "results",
        "api/index",
    ):
        assert (tmp_path / f"{name}.html").exists(), name
    notebooks = sorted(
        f[:-6] for f in os.listdir(os.path.join(ROOT, "colabs")) if f.endswith(".ipynb")
    )
    for name in notebooks:
        page = (tmp_path / "notebooks" / f"{name}.html").read_text()
        assert "<img" in page and "cell_output" in page, (
            f"{name}: rendered without its saved outputs"
        )
    # a default as the source writes it, not the 158 orders of the RDP grid
    privacy = (tmp_path / "api" / "privacy.html").read_text()
    assert "RDP_ORDERS" in privacy and "1.1, 1.2, 1.3" not in privacy
    for package in SUBPACKAGES:
        page_name = "fedjax_dp" if package == "fedjax_dp" else package.split(".", 1)[1]
        page = (tmp_path / "api" / f"{page_name}.html").read_text()
        module = importlib.import_module(package)
        for name in module.__all__:
            value = getattr(module, name)
            if callable(value) and not isinstance(value, type(os)):
                assert f'id="{package}.{name}"' in page, (
                    f"{package}.{name} is missing from api/{page_name}"
                )


@pytest.mark.parametrize("module_name", sorted(DOCTESTED))
def test_the_docstring_examples_run(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=True
    )
    assert result.failed == 0
    assert result.attempted >= DOCTESTED[module_name], f"{module_name}: its examples are gone"


def test_the_correlated_noise_example_runs_a_blt_stream_under_min_separation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = open(os.path.join(DOCS, "correlated_noise.md")).read()
    (example,) = [
        b for b in re.findall(r"```python\n(.*?)```", page, re.S) if '"dp.noise": "blt"' in b
    ]
    example = (
        textwrap.dedent(example)
        .replace('"rounds": 24', '"rounds": 6')
        .replace("/tmp/blt", str(tmp_path / "blt"))
    )
    namespace = {}
    exec(compile(example, "docs/correlated_noise.md", "exec"), namespace)
    result = namespace["result"]
    assert result.rounds == 6 and result.formal is True and 0 < result.epsilon < float("inf")
    import json

    privacy = json.load(open(tmp_path / "blt" / "privacy.json"))
    assert privacy["accounting"]["noise_strategy"] == "blt" and privacy["sampling"].startswith(
        "4-min-separation"
    )


def test_the_package_docstrings_carry_no_dated_measurements():
    """Measurements live in ``benchmarks/RESULTS.md`` and the docs (``docs/measurements.md``); a
    module says what it does, why, and which paper and equation."""
    import pathlib

    dated = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in pathlib.Path(ROOT, "fedjax_dp").rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if dated.search(line)
    ]
    assert not found, found


def test_accountants_signature_is_short_and_its_methods_say_what_they_do():
    """Its signature rendered the whole default order grid (158 numbers); compose, epsilon and
    delta had no docstring. The grid's numbers are unchanged."""
    import inspect

    from fedjax_dp.privacy.accounting.accountant import RDP_ORDERS, Accountant

    assert str(inspect.signature(Accountant)).endswith("rdp_orders=RDP_ORDERS)")
    assert RDP_ORDERS == tuple(
        [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [80, 96, 128, 256, 512, 1024]
    )
    assert all(getattr(Accountant, name).__doc__ for name in ("compose", "epsilon", "delta"))


def test_every_fedjax_dp_training_name_the_getting_started_page_cites_is_public():
    """The page sent users to ``callbacks`` and ``StopWhen``, which the API page did not document
    (it documents ``__all__``)."""
    import fedjax_dp.training

    page = open(os.path.join(DOCS, "getting_started.md")).read()
    cited = set(re.findall(r"fedjax_dp\.training\.(\w+)", page))
    assert {"Callback", "StopWhen"} <= cited
    modules = {n for n in cited if importlib.util.find_spec(f"fedjax_dp.training.{n}") is not None}
    assert cited - modules <= set(fedjax_dp.training.__all__)
