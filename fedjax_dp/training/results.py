"""The results directory: ``config.json``, ``metrics.jsonl``, ``summary.json`` and the accuracy plot."""

from __future__ import annotations

import json
import os

import numpy as np


class ResultsWriter:
    """Appends one JSON line per round; refuses to overwrite a previous run unless told to."""

    def __init__(self, workdir: str, config_json: str, overwrite: bool = False, append: bool = False):
        """``append``: continue a resumed run's ``metrics.jsonl`` (its config must be the same)."""
        self.workdir = workdir
        self.metrics_path = os.path.join(workdir, "metrics.jsonl")
        if append:
            with open(os.path.join(workdir, "config.json")) as f:
                if json.loads(f.read()) != json.loads(config_json):
                    raise ValueError(f"cannot resume {workdir}: its config.json differs from this run's config")
            self._file = open(self.metrics_path, "a")
            return
        if os.path.exists(self.metrics_path) and not overwrite:
            raise FileExistsError(
                f"{self.metrics_path} exists: choose another --workdir or pass --overwrite to replace that run"
            )
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config_json)
        self._file = open(self.metrics_path, "w")

    def log(self, row: dict) -> None:
        self._file.write(json.dumps(_jsonable(row)) + "\n")
        self._file.flush()

    def write_json(self, name: str, payload: dict) -> str:
        path = os.path.join(self.workdir, name)
        with open(path, "w") as f:
            json.dump(_jsonable(payload), f, indent=2)
        return path

    def close(self) -> None:
        self._file.close()


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and np.ndim(value) == 0:
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def read_metrics(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_accuracy(rows: list[dict], path: str, title: str) -> str:
    """Accuracy vs round (central test, mean per-client, mean personalised) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluated = [r for r in rows if "test_accuracy" in r or "personalized_accuracy" in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("test_accuracy", "central test"), ("client_accuracy", "mean per-client"),
                       ("personalized_accuracy", "mean personalised (own model, own test data)")):
        points = [(r["round"], r[key]) for r in evaluated if key in r]
        if points:
            ax.plot(*zip(*points), marker="o", markersize=3, label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
