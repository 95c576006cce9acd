"""Every notebook in colabs/ is Colab-ready (an install cell, a ``parameters`` cell, saved outputs
with at least one plot) and runs top to bottom on tiny settings: the code cells are executed in one
namespace, the ``parameters`` cell followed by ``TINY``'s overrides (shell and magic lines
skipped)."""

import glob
import json
import os

import pytest

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "colabs", "*.ipynb")))
TINY = {
    "quickstart.ipynb": "ROUNDS = 2",
    "dp_fedavg.ipynb": "ROUNDS, EPSILON = 2, 2.0",
    "ldp_minibatch.ipynb": "ROUNDS, LOCAL_STEPS = 1, 2",
    "cuag_pfl.ipynb": "ROUNDS, LOCAL_STEPS = 1, 1",
    "uga_fedmeta.ipynb": "ROUNDS = 2",
    "dp_ftrl.ipynb": "ROUNDS, SEPARATION = 4, 2",
    "your_model_and_data.ipynb": "ROUNDS = 2",
    "distributed_dp.ipynb": "ROUNDS, BITS = 2, (12,)",
    "privacy_audit.ipynb": "ROUNDS, CANARIES, EPSILONS = 2, 20, (8.0,)",
    "hypergradients.ipynb": "ROUNDS = 2",
}
"""Overrides of each notebook's ``parameters`` cell for the suite (every notebook must have an
entry)."""


def _cells(path):
    return json.load(open(path))["cells"]


def test_every_notebook_is_colab_ready_with_saved_outputs_and_plots():
    assert {os.path.basename(p) for p in NOTEBOOKS} == set(TINY)
    for path in NOTEBOOKS:
        code = [c for c in _cells(path) if c["cell_type"] == "code"]
        assert 'pip", "install"' in "".join(code[0]["source"]), (
            f"{path}: the first code cell installs fedjax_dp"
        )
        assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in code), (
            f"{path}: no parameters cell"
        )
        assert all(c.get("execution_count") for c in code), (
            f"{path}: saved without running every cell"
        )
        images = [o for c in code for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        assert images, f"{path}: no saved plot"
        errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path}: saved with an error"


SLOW = ("uga_fedmeta", "cuag_pfl")
"""Notebooks whose tiny run takes over a minute on 2 cores (five methods, each compiled): run with
FEDJAX_DP_SLOW=1; their methods run through the loop in the fast tests (test_pfldyn_cuag,
test_algorithm_protocol, test_uga, test_fedmeta_fedprox_fedshare) and their saved outputs are
checked above."""


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.slow) if any(n in p for n in SLOW) else p
        for p in NOTEBOOKS
    ],
    ids=os.path.basename,
)
def test_notebook_runs_on_tiny_settings(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace = {"__name__": "__main__"}
    for cell in _cells(path):
        if cell["cell_type"] != "code":
            continue
        source = "".join(
            line for line in cell["source"] if not line.lstrip().startswith(("!", "%"))
        )
        exec(compile(source, f"{os.path.basename(path)}:{cell.get('id')}", "exec"), namespace)
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            exec(TINY[os.path.basename(path)] + f"\nWORKDIR = {str(tmp_path)!r}", namespace)


def test_the_install_cell_takes_an_uploaded_wheel_or_a_git_url_without_an_edit(
    tmp_path, monkeypatch
):
    """It stopped with 'set REPOSITORY above' until the user edited the cell."""
    import importlib.util
    import subprocess

    sources = {
        "".join(next(c for c in _cells(p) if c["cell_type"] == "code")["source"]) for p in NOTEBOOKS
    }
    assert len(sources) == 1, "every notebook's install cell is the same"
    (source,) = sources
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "fedjax_dp" else real_find_spec(name, *args),
    )
    installed = []
    monkeypatch.setattr(subprocess, "check_call", lambda command: installed.append(command[-1]))
    monkeypatch.delenv("FEDJAX_DP_SOURCE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fedjax_dp-0.2.0-py3-none-any.whl").write_bytes(b"")
    exec(source, {})
    (tmp_path / "fedjax_dp-0.2.0-py3-none-any.whl").unlink()
    monkeypatch.setenv("FEDJAX_DP_SOURCE", "https://example.org/fedjax_dp.git")
    exec(source, {})
    assert installed == [
        "fedjax_dp-0.2.0-py3-none-any.whl",
        "git+https://example.org/fedjax_dp.git",
    ]
