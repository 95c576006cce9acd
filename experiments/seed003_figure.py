"""Seed 003: accuracy against the per-client epsilon threshold, one panel per dataset and model,
drawn from the committed raw rows of ``experiments/seed003_ldp.py`` runs (no training).

Each ``--panel TITLE FILE [FILE ...]`` is one panel; a file is either one run's ``rows.json``
(``{"rows": [...]}``) or a collection of them (``{"runs": {name: {"args": ..., "rows": [...]}}}``).
Only the rows of ``--seed`` are drawn (rows without a seed field count as seed 0, as the files say).

    python experiments/seed003_figure.py \\
        --panel "MNIST, patent's CNN (cnn_fedavg)" experiments/raw_rows/seed003_cnn_grid.json \\
        --panel "CIFAR-10, patent's CNN (cnn_pfl)"
        experiments/raw_rows/seed003_cifar10_cnn_grid.json \\ --out
        experiments/figures/seed003_accuracy_vs_epsilon.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from seed003_ldp import plot_panel, plt  # noqa: E402


def seeded_rows(path: str) -> list[dict]:
    """Every row of one committed file (a ``rows.json`` of ``seed003_ldp.py``, or ``runs`` of them),
    each with its ``seed``: the row's own, else its run's ``args.seed``, else 0 (the grids'
    default)."""
    with open(path) as f:
        data = json.load(f)
    runs = list(data["runs"].values()) if "runs" in data else [data]
    rows = []
    for run in runs:
        run_seed = run.get("args", {}).get("seed", 0)
        rows += [{**r, "seed": r.get("seed", run_seed)} for r in run["rows"]]
    return rows


def load_rows(path: str, seed: int) -> list[dict]:
    """The rows of one committed file, of one seed."""
    return [r for r in seeded_rows(path) if r["seed"] == seed]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--panel", nargs="+", action="append", required=True, metavar="TITLE_THEN_FILES"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    for panel in args.panel:
        if len(panel) < 2:
            parser.error(f"--panel needs a title and at least one file, got {panel!r}")
    fig, axes = plt.subplots(1, len(args.panel), figsize=(5.5 * len(args.panel), 4), squeeze=False)
    for ax, (title, *files) in zip(axes[0], args.panel):
        plot_panel(ax, [r for path in files for r in load_rows(path, args.seed)], title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(args.out)


if __name__ == "__main__":
    main()
