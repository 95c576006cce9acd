"""Rewrites the golden files: ``python -m tests.golden.record [name ...]`` (all names by
default)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from fedjax_dp.training.loop import run_experiment
from tests.golden.configs import all_configs

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("metrics.jsonl", "privacy.json")


def run(name: str, cfg, workdir: str) -> dict:
    """Runs one golden configuration; returns ``{file name: parsed content}``."""
    run_experiment(cfg, workdir, progress=False)
    # round 0 (the initial model, issue 19) is
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        # not golden
        metrics = [row for line in f if line.strip() and (row := json.loads(line))["round"] > 0]
    with open(os.path.join(workdir, "privacy.json")) as f:
        privacy = json.load(f)
    return {"metrics.jsonl": metrics, "privacy.json": privacy}


def main(names: list[str]) -> None:
    table = all_configs()
    for name in names or sorted(table):
        with tempfile.TemporaryDirectory() as tmp:
            run(name, table[name], os.path.join(tmp, name))
            target = os.path.join(HERE, "data", name)
            os.makedirs(target, exist_ok=True)
            for file in FILES:
                shutil.copy(os.path.join(tmp, name, file), os.path.join(target, file))
        print("recorded", name)


if __name__ == "__main__":
    main(sys.argv[1:])
