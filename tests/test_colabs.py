"""Every notebook in colabs/ runs top to bottom (code cells executed in one namespace; shell and
magic lines such as ``!pip install`` are skipped)."""

import glob
import json
import os

import pytest

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "colabs", "*.ipynb")))


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if "uga_fedmeta" in p else p
                                  for p in NOTEBOOKS], ids=os.path.basename)
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    for cell in json.load(open(path))["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(line for line in cell["source"] if not line.lstrip().startswith(("!", "%")))
        exec(compile(source, f"{os.path.basename(path)}:{cell.get('id')}", "exec"), namespace)
