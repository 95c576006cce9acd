"""Seed 003, claim 2's history term: the method at alpha in {1, 0.75, 0.5, 0.25} on IID and
label-skewed MNIST, with the plain mean beside it, over seeds (issue 78).

The patent's server step is w_{t+1} = (1 - alpha) w_t + alpha sum_k a_k w_k (claim 2, step s6):
alpha = 1 switches the history term off, and every headline run had alpha = 1. This reads the
``rows.json`` of ``experiments/seed003_ldp.py`` runs made with ``--alpha A --methods ldp ldp_mean``
(one folder per partition, epsilon, alpha and seed, or a committed raw-rows file holding them under
``runs``) and prints, per partition and per-client epsilon, the mean final accuracy of each alpha
with its 95 % t half-width, and two paired differences by
seed: the history term (ldp at alpha minus ldp at alpha = 1) and the correlation weighting at that
alpha (ldp minus ldp_mean, the plain mean on the same privacy path).

    python experiments/seed003_alpha.py results/s3alpha/*/rows.json --json
    results/seed003_alpha.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from seed003_seeds import interval  # noqa: E402


def runs_of(path: str) -> list[dict]:
    """The rows.json documents in ``path``: one file, or a raw-rows file with a list of them under
    ``runs``."""
    with open(path) as f:
        data = json.load(f)
    return data["runs"] if "runs" in data else [data]


def accuracies(documents: list[dict]) -> dict:
    """(partition, epsilon, alpha, method) -> {seed: final test accuracy}."""
    table = defaultdict(dict)
    for doc in documents:
        args = doc["args"]
        for row in doc["rows"]:
            key = (args["partition"], float(row["epsilon"]), float(args["alpha"]), row["method"])
            if args["seed"] in table[key]:
                raise ValueError(f"two rows for {key} at seed {args['seed']}")
            table[key][args["seed"]] = float(row["accuracy"])
    return table


def paired(a: dict, b: dict) -> tuple:
    seeds = sorted(set(a) & set(b))
    differences = [a[s] - b[s] for s in seeds]
    return (*interval(differences), len(seeds)) if seeds else (float("nan"), float("nan"), 0)


def summarise(table: dict) -> list[dict]:
    rows = []
    for partition, epsilon in sorted({(k[0], k[1]) for k in table}):
        for alpha in sorted({k[2] for k in table if k[:2] == (partition, epsilon)}, reverse=True):
            ldp, mean = (
                table.get((partition, epsilon, alpha, "ldp"), {}),
                table.get((partition, epsilon, alpha, "ldp_mean"), {}),
            )
            base = table.get((partition, epsilon, 1.0, "ldp"), {})
            rows.append(
                {
                    "partition": partition,
                    "epsilon": epsilon,
                    "alpha": alpha,
                    "ldp": (*interval(list(ldp.values())), len(ldp)) if ldp else None,
                    "ldp_mean": (*interval(list(mean.values())), len(mean)) if mean else None,
                    "history": paired(ldp, base) if alpha != 1.0 else None,
                    "correlation": paired(ldp, mean),
                }
            )
    return rows


def fmt(cell, signed: bool = False) -> str:
    if cell is None or not cell[2]:
        return "-"
    return f"{cell[0]:{'+' if signed else ''}.3f} +- {cell[1]:.3f} (n {cell[2]})"


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("files", nargs="+")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    rows = summarise(accuracies([doc for path in args.files for doc in runs_of(path)]))
    print(
        "| partition | per-client epsilon | alpha | ldp (correlation weights) | ldp_mean (plain"
        " mean) | history: ldp(alpha) - ldp(1), paired | correlation: ldp - ldp_mean, paired |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['partition']} | {r['epsilon']:g} | {r['alpha']:g} | {fmt(r['ldp'])} |"
            f" {fmt(r['ldp_mean'])} | {fmt(r['history'], True)} | {fmt(r['correlation'], True)} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
