"""Seed 004, Table 1 from recorded runs: the epsilon each DP method had spent in the round its
accuracy first reached each target accuracy, read from committed raw rows
(``experiments/raw_rows/seed004_*.json``; runs nothing).

CUAG-PFL's Table 1 (CIFAR-10, ACID3 / 5 / 7) gives, for three target accuracies per split (the best
accuracies of UDP, DP-SCAFFOLD and PriFedSync at T = 300), the epsilon CUAG-PFL, PriFedSync,
DP-SCAFFOLD and UDP "need" to reach each. Here every cell is read from a run's evaluations (every 10
rounds): the first evaluation at or above the target, the epsilon recorded with it (dp-accounting's,
for what ran; ``formal: false`` where it is a paper's figure composed over what ran: CUAG-PFL's
paper mode, UDP's paper calibration) and, for PriFedSync, the seed's own f-DP CLT figure at that
round beside the formal one. Targets: the paper's, and ours (our baselines' best accuracies).

    python experiments/seed004_table1.py --json results/seed004_table1.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from provenance import provenance  # noqa: E402
from fedjax_dp.algorithms.prifedsync import claimed_mu  # noqa: E402
from fedjax_dp.privacy.accounting import gdp  # noqa: E402
from fedjax_dp.privacy.mechanisms import adaptive_gdp  # noqa: E402

RAW = os.path.join(HERE, "raw_rows")
PAPER = {
    "acid3": {
        0.5528: {"CUAG-PFL": 0.92, "PriFedSync": 0.41, "DP-SCAFFOLD": 5.03, "UDP": 10.0},
        0.7010: {"CUAG-PFL": 0.92, "PriFedSync": 1.99, "DP-SCAFFOLD": 23.31, "UDP": None},
        0.9016: {"CUAG-PFL": 0.92, "PriFedSync": 10.15, "DP-SCAFFOLD": None, "UDP": None},
    },
    "acid5": {
        0.5981: {"CUAG-PFL": 0.92, "PriFedSync": 1.93, "DP-SCAFFOLD": 15.77, "UDP": 10.0},
        0.6286: {"CUAG-PFL": 0.92, "PriFedSync": 2.28, "DP-SCAFFOLD": None, "UDP": 10.0},
        0.8592: {"CUAG-PFL": 0.92, "PriFedSync": 10.15, "DP-SCAFFOLD": None, "UDP": None},
    },
    "acid7": {
        0.5480: {"CUAG-PFL": 0.92, "PriFedSync": 2.23, "DP-SCAFFOLD": 15.25, "UDP": 10.0},
        0.6632: {"CUAG-PFL": 0.92, "PriFedSync": 3.66, "DP-SCAFFOLD": None, "UDP": 10.0},
        0.8298: {"CUAG-PFL": 0.92, "PriFedSync": 10.21, "DP-SCAFFOLD": None, "UDP": None},
    },
}
"""The paper's Table 1 (Li, Xiao and Chen, "CUAG-PFL", Chinese Journal of Computers, 2024): split ->
target -> method -> epsilon (None: "not reached", the paper's backslash)."""

RUNS = (  # (method column, label, raw-row file, run index): the committed 300-round ACID3 runs
    (
        "CUAG-PFL",
        "paper mode, authors' pipeline + crop/flip, seed 0",
        "seed004_c10_cuag_paper_authors_augment_300rounds",
        0,
    ),
    (
        "CUAG-PFL",
        "paper mode, the same + signs + refresh, seed 0",
        "seed004_c10_cuag_paper_authors_augment_300rounds",
        1,
    ),
    (
        "CUAG-PFL",
        "paper mode, authors' pipeline + crop/flip, seed 1",
        "seed004_c10_cuag_paper_authors_augment_300rounds_seed1",
        0,
    ),
    (
        "CUAG-PFL",
        "paper mode, the same + signs + refresh, seed 1",
        "seed004_c10_cuag_paper_authors_augment_signs_refresh_300rounds_seed1",
        0,
    ),
    (
        "CUAG-PFL",
        "paper mode, authors' pipeline + signs + refresh, no crop/flip (174 rounds)",
        "seed004_c10_cuag_paper_authors_signed_refreshed_174rounds",
        0,
    ),
    (
        "PriFedSync",
        "as the seed writes it (cohort mean; collapsed, stopped at r140)",
        "seed004_table2_prifedsync_140rounds",
        0,
    ),
    (
        "PriFedSync",
        "FedDyn's population mean (the authors' code)",
        "seed004_prifedsync_population_mean_300rounds",
        0,
    ),
    (
        "DP-SCAFFOLD",
        "fixed clip 1, sigma 1 (prototype-adapted)",
        "seed004_table2_dpscaffold_300rounds",
        0,
    ),
    ("UDP", "paper calibration, epsilon 10", "seed004_table2_udp_300rounds", 0),
    ("UDP", "sound, epsilon 10 (stopped at r130)", "seed004_table2_udp_300rounds", 1),
)
PRIFEDSYNC_SETTING = {
    "sigma": 0.45,
    "sampling_rate": 0.1,
    "batch_size": 50,
    "dataset_size": 500.0,
    "delta": 1e-5,
}
"""Seed 004's PriFedSync setting (sigma 0.45, lambda 0.1, B 50, |D_n| 500 on ACID3, delta 1e-5), for
its own figure."""


CUAG_SETTING = {
    "mu": 0.25,
    "delta": 1e-5,
    "sampling_rate": 0.1,
    "batch_size": 50,
    "dataset_size": 500,
    "local_steps": 25,
}
"""The CUAG-PFL paper-mode runs' setting (``cuag_pfl_cifar10:authors``: mu 0.25, lambda 0.1, B 50,
P 25; |D_n| about 500 on ACID3), for the paper's formula. Alg. 4's sigma_t makes the formula over T
rounds mu sqrt(H_T) whatever lambda, B, |D| and P are."""


def load(name: str, index: int) -> dict:
    with open(os.path.join(RAW, name + ".json")) as f:
        return json.load(f)["runs"][index]


def prifedsync_figure(rounds: int) -> float:
    """The seed's f-DP CLT epsilon of PriFedSync after ``rounds`` rounds (no guarantee:
    ``prifedsync.claimed_mu``)."""
    s = PRIFEDSYNC_SETTING
    mu = claimed_mu(s["sigma"], rounds, s["sampling_rate"], s["batch_size"], s["dataset_size"])
    return gdp.epsilon_from_mu(mu, s["delta"]) if rounds else 0.0


def cuag_paper_formula(rounds: int) -> float:
    """CUAG-PFL paper mode's epsilon after ``rounds`` rounds: the paper's formula over the rounds
    run (``adaptive_gdp.schedule_mu``, converted by ``gdp.epsilon_from_mu``; no guarantee). The
    committed raw rows were recorded before that formula was fixed (2026-12-04) and carry the old
    per-client figure (1.26 at round 20): the table recomputes it (1.88 at round 20)."""
    s = dict(CUAG_SETTING)
    mu, delta = s.pop("mu"), s.pop("delta")
    return gdp.epsilon_from_mu(adaptive_gdp.schedule_mu(rounds, mu, **s), delta) if rounds else 0.0


def first_reaching(run: dict, target: float) -> dict | None:
    """The first evaluation whose accuracy (the run's own metric) is at or above ``target``, or
    None."""
    metric = run["row"]["metric"]
    for evaluation in run["evaluations"]:
        if evaluation.get(metric) is not None and evaluation[metric] >= target:
            return evaluation
    return None


def cell(method: str, run: dict, target: float) -> dict:
    """What one table cell holds: the round, the epsilon and whether a proof covers it (None: not
    reached)."""
    hit = first_reaching(run, target)
    if hit is None:
        return {"reached": False, "best": run["row"]["best"], "rounds_run": run["row"]["rounds"]}
    formal = hit.get("formal", run["row"].get("formal", True)) if hit["round"] else True
    out = {
        "reached": True,
        "round": hit["round"],
        "epsilon": hit.get("epsilon", 0.0),
        "formal": bool(formal),
    }
    if method == "PriFedSync":
        out["seed_figure"] = prifedsync_figure(hit["round"])
    if method == "CUAG-PFL" and hit["round"] and not out["formal"]:
        out["recorded_epsilon"] = out["epsilon"]
        out["epsilon"] = cuag_paper_formula(hit["round"])
    return out


def table(targets: dict[str, list[float]]) -> list[dict]:
    rows = []
    for method, label, name, index in RUNS:
        run = load(name, index)
        for split, values in targets.items():
            for target in values:
                rows.append(
                    {
                        "split": split,
                        "target": target,
                        "method": method,
                        "run": label,
                        "file": name,
                        "paper": PAPER.get(split, {}).get(target, {}).get(method, "-"),
                        **cell(method, run, target),
                    }
                )
    return rows


def text(c: dict) -> str:
    if not c["reached"]:
        return f"not reached (best {c['best']:.4f} in {c['rounds_run']} rounds)"
    if c["round"] == 0:
        return "0 at r0 (the untrained model's prototypes: no release yet)"
    eps = f"{c['epsilon']:,.0f}" if c["epsilon"] >= 1000 else f"{c['epsilon']:.3f}"
    label = "" if c["formal"] else ", formal: false"
    seed = f"; the seed's figure {c['seed_figure']:.2f}" if "seed_figure" in c else ""
    return f"{eps} at r{c['round']}{label}{seed}"


def markdown(rows: list[dict]) -> str:
    lines = [
        "| split | target | method | run | epsilon spent when first reached | paper |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        paper = "not reached" if r["paper"] is None else r["paper"]
        lines.append(
            f"| {r['split']} | {r['target']:.4f} | {r['method']} | {r['run']} | {text(r)} |"
            f" {paper} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--ours",
        type=float,
        nargs="*",
        default=[],
        help=(
            "extra targets (e.g. our baselines' best accuracies), added to the paper's ACID3"
            " targets"
        ),
    )
    p.add_argument("--json", default="", help="write the rows here")
    args = p.parse_args(argv)
    targets = {"acid3": sorted(set(PAPER["acid3"]) | set(args.ours))}
    rows = table(targets)
    print(markdown(rows))
    if args.json:
        setting = provenance()  # before the file is opened: writing it dirties the tree
        with open(args.json, "w") as f:
            json.dump({"setting": setting, "targets": targets, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
