"""Seed 003 over several seeds: each method's mean final accuracy and the paired differences the
patent's claims are about, with 95 % t intervals.

Reads raw-row files of ``experiments/seed003_ldp.py`` runs (its ``rows.json``, or a committed
raw-rows file with ``runs`` of them; ``seed003_figure.seeded_rows``: a row's seed is its own, else
its run's, else 0). For every per-client epsilon it prints:

  mean +- t half-width of each method's final test accuracy;
  ldp_fixed - ldp (claim 1, "less noise for the same guarantee": fixed noise calibrated per client
    against the threshold schedule) and ldp_mean - ldp (claim 2, "better accuracy from correlation
    weighting": the plain mean on the same privacy path), paired by seed.

    python experiments/seed003_seeds.py experiments/raw_rows/seed003_cnn_seeds.json --json
    results/cnn_seeds.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict

from scipy import stats

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from seed003_figure import seeded_rows  # noqa: E402

PAIRS = (("ldp_fixed", "ldp"), ("ldp_mean", "ldp"))


def interval(values: list[float]) -> tuple[float, float]:
    """(mean, 95 % t half-width); the half-width is nan for a single value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)


def summarise(rows: list[dict]) -> dict:
    """epsilon -> {method: (mean, half-width, n), "a - b": (mean, half-width, n, per-seed
    differences)}."""
    table = defaultdict(dict)  # (epsilon, method) -> {seed: accuracy}
    for row in rows:
        key = (float(row["epsilon"]), row["method"])
        if row["seed"] in table[key]:
            raise ValueError(
                f"two rows for {row['method']} at epsilon {row['epsilon']}, seed {row['seed']}"
            )
        table[key][row["seed"]] = float(row["accuracy"])
    out = defaultdict(dict)
    for (epsilon, method), by_seed in sorted(table.items()):
        out[epsilon][method] = (*interval(list(by_seed.values())), len(by_seed))
    for epsilon in out:
        for a, b in PAIRS:
            seeds = sorted(set(table[(epsilon, a)]) & set(table[(epsilon, b)]))
            if seeds:
                differences = [table[(epsilon, a)][s] - table[(epsilon, b)][s] for s in seeds]
                out[epsilon][f"{a} - {b}"] = (*interval(differences), len(seeds), differences)
    return dict(out)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("files", nargs="+")
    p.add_argument("--json", default="", help="write the summary here")
    args = p.parse_args(argv)
    rows = [row for path in args.files for row in seeded_rows(path)]
    summary = summarise(rows)
    columns = ["ldp", "ldp_fixed", "ldp_mean"] + [f"{a} - {b}" for a, b in PAIRS]
    print("| per-client epsilon | " + " | ".join(columns) + " |")
    print("| --- " * (len(columns) + 1) + "|")
    for epsilon, cells in sorted(summary.items()):
        text = [
            (
                f"{cells[c][0]:+.3f} +- {cells[c][1]:.3f} (n {cells[c][2]})"
                if " - " in c and c in cells
                else (
                    f"{cells[c][0]:.3f} +- {cells[c][1]:.3f} (n {cells[c][2]})"
                    if c in cells
                    else "-"
                )
            )
            for c in columns
        ]
        print(f"| {epsilon:g} | " + " | ".join(text) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(k): v for k, v in summary.items()}, f, indent=1)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
