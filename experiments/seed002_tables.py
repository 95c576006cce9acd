"""Seed 002 (UGA / FedMeta) experiments: the six methods on one dataset, or the D_meta overlap
sweep.

Methods: FedAvg, FedProx (mu = 2e-4), FedShare (shared 1 %), UGA, FedMeta (FedAvg clients), FedMeta
w/ UGA. Output under ``--out``: one results directory per run, ``table.json``, ``table.md`` (final
and best accuracy, rounds to each threshold, wall time: the shape of the paper's Tables 1-3) and
``curves.png``. ``--overlap-sweep`` (FEMNIST) runs FedAvg and FedMeta with D_meta drawn from 20
writers overlapping the training writers by 0/25/50/75/100 % (Fig. 5) and evaluates both on the
central test set.

    python experiments/seed002_tables.py --dataset femnist --rounds 15 --out results/seed002/femnist
    python experiments/seed002_tables.py --dataset femnist --overlap-sweep --rounds 10
Overrides for reduced runs: ``--set client.learning_rate=0.05 --eta-g 0.5`` (stated in the table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import shared_data  # noqa: F401  (FEDJAX_DP_DATA: the shipped configs' data folder)
from fedjax_dp import configs
from fedjax_dp.training import results
from fedjax_dp.training.loop import run_experiment
from fedjax_dp.training.compilation_cache import use_persistent_cache
from fedjax_dp.training.results import dumps as strict_json
from preflight import apply_overrides, checked_runs
from provenance import stamped

HERE = os.path.dirname(os.path.abspath(__file__))
METHODS = {
    "fedavg": ("fedavg", False),
    "fedprox": ("fedprox", False),
    "fedshare": ("fedshare", False),
    "uga": ("uga", False),
    "fedmeta": ("fedavg", True),
    "fedmeta_uga": ("uga", True),
}
LABELS = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedshare": "FedShare",
    "uga": "UGA",
    "fedmeta": "FedMeta",
    "fedmeta_uga": "FedMeta w/ UGA",
}
THRESHOLDS = {"cifar10": (0.5, 0.6, 0.75), "femnist": (0.7, 0.8, 0.9), "shakespeare": (0.47,)}


def base_config(dataset: str):
    return configs.get(f"uga_fedmeta_{dataset}")


def method_config(args, method: str, overlap: float | None = None):
    cfg = base_config(args.dataset)
    cfg.rounds, cfg.eval_every, cfg.seed = args.rounds, args.eval_every, args.seed
    apply_overrides(cfg, args.set)
    cfg.algorithm, cfg.fedmeta.enabled = METHODS[method]
    if cfg.algorithm == "uga":
        cfg.server.learning_rate = args.eta_g or cfg.client.learning_rate  # the paper: eta_g = eta
        cfg.server.lr_decay = cfg.client.lr_decay
    if overlap is not None:
        cfg.server_data.overlap = overlap
    return cfg


def rounds_to(rows, threshold: float):
    for r in rows:
        if "test_accuracy" in r and r["test_accuracy"] >= threshold:
            return r["round"]
    return None


def summarise(name, workdir, summary: dict, thresholds):
    rows = results.read_metrics(workdir)
    return {
        "run": name,
        "final_accuracy": summary["final"]["test_accuracy"],
        "best_accuracy": summary["best_accuracy"],
        "rounds": summary["rounds"],
        "seconds": summary["seconds"],
        "stop_reason": summary.get("stop_reason"),
        "rounds_to": {f"{t:g}": rounds_to(rows, t) for t in thresholds},
        "curve": [(r["round"], r["test_accuracy"]) for r in rows if "test_accuracy" in r],
    }


def write_outputs(out, rows, thresholds, settings, title):
    with open(os.path.join(out, "table.json"), "w") as f:
        f.write(strict_json(stamped({"settings": settings, "rows": rows}), indent=2))
    head = (
        "| run | final acc | best acc | "
        + " | ".join(f"rounds to {t:g}" for t in thresholds)
        + " | seconds | stopped |"
    )
    lines = [f"Settings: {settings}", "", head, "|" + " --- |" * (5 + len(thresholds))]
    for r in rows:
        reach = [str(r["rounds_to"][f"{t:g}"] or f">{r['rounds']}") for t in thresholds]
        lines.append(
            f"| {r['run']} | {r['final_accuracy']:.4f} | {r['best_accuracy']:.4f} | "
            + " | ".join(reach)
            + f" | {r['seconds']:.0f} | {r['stop_reason'] or ''} |"
        )
    text = "\n".join(lines)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        ax.plot(*zip(*r["curve"]), marker=".", label=r["run"])
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=120)


def _stored_run(workdir: str, cfg) -> str:
    """What ``--reuse`` finds in ``workdir`` for this config: ``finished`` (kept), ``interrupted``
    (resumed from its checkpoint, identical to an uninterrupted run) or ``none`` (run from scratch:
    nothing there, or a different config). Options the stored config predates (added to the library
    later, at their defaults) are ignored."""
    try:
        with (
            open(os.path.join(workdir, "config.json")) as f,
            open(os.path.join(workdir, "summary.json")) as g,
        ):
            stored, summary = json.load(f), json.load(g)
    except FileNotFoundError:
        return "none"
    if not _agrees(stored, json.loads(cfg.to_json_best_effort())):
        return "none"
    if not summary.get("interrupted", False):
        return "finished"
    return "interrupted" if os.path.isdir(os.path.join(workdir, "checkpoints")) else "none"


def _agrees(stored, current) -> bool:
    if isinstance(stored, dict) and isinstance(current, dict):
        return all(k in current and _agrees(v, current[k]) for k, v in stored.items())
    return stored == current


def main():
    use_persistent_cache()  # the cells' programs, compiled once across cells and runs
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", choices=sorted(THRESHOLDS), default="femnist")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--eta-g", type=float, default=0.0, help="UGA's server rate (default: the client rate)"
    )
    parser.add_argument(
        "--set", nargs="*", default=[], help="config overrides, e.g. client.learning_rate=0.05"
    )
    parser.add_argument("--overlap-sweep", action="store_true")
    parser.add_argument("--overlaps", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--out", default="")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep finished runs of the same config; resume interrupted ones from their checkpoint",
    )
    args = parser.parse_args()
    out = args.out or os.path.join(
        "results", "seed002", args.dataset + ("-overlap" if args.overlap_sweep else "")
    )
    thresholds = THRESHOLDS[args.dataset]
    runs = (
        [(f"fedmeta-overlap{o:g}", "fedmeta", o) for o in args.overlaps]
        + [("fedavg", "fedavg", None)]
        if args.overlap_sweep
        else [(m, m, None) for m in args.methods]
    )
    runs = checked_runs(
        parser,
        lambda: [
            (name, method_config(args, method, overlap), method, overlap)
            for name, method, overlap in runs
        ],
    )
    os.makedirs(out, exist_ok=True)
    rows = []
    for name, cfg, method, overlap in runs:
        workdir = os.path.join(out, name)
        stored = _stored_run(workdir, cfg) if args.reuse else "none"
        if stored == "finished":
            with open(os.path.join(workdir, "summary.json")) as f:
                summary = json.load(f)
        else:
            summary = dataclasses.asdict(
                run_experiment(
                    cfg, workdir, overwrite=True, progress=False, resume=stored == "interrupted"
                )
            )
        if summary["interrupted"]:  # SIGINT / SIGTERM: checkpointed; --reuse resumes it
            print(
                f"{name}: interrupted after round {summary['rounds']}; stopping the sweep "
                "(run again with --reuse to resume)",
                flush=True,
            )
            break
        rows.append(
            summarise(
                LABELS[method] + (f" (overlap {overlap:.0%})" if overlap is not None else ""),
                workdir,
                summary,
                thresholds,
            )
        )
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "curve"}), flush=True)
    settings = {
        "dataset": args.dataset,
        "rounds": args.rounds,
        "seed": args.seed,
        "overrides": args.set,
        "eta_g": args.eta_g or "client lr",
    }
    write_outputs(out, rows, thresholds, settings, f"seed 002 on {args.dataset}")


if __name__ == "__main__":
    main()
