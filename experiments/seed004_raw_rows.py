"""The raw rows of finished (or stopped) seed-004 runs, to commit beside ``experiments/RESULTS.md``:
each run's table row (``seed004_tables.result_row``), every evaluation, and a compact per-round
trace (loss, update norm, epsilon, drops, uplink), read from its results directory (``results/`` is
not in the repository).

    python experiments/seed004_raw_rows.py experiments/raw_rows/seed004_table2_udp_300rounds.json \\
        --setting "the command, commit, date, machine"
        results/seed004_t2_300_udp/acid3-UDP__sound__epsilon_10_
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from flax.traverse_util import flatten_dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from provenance import provenance  # noqa: E402

from seed004_tables import result_row  # noqa: E402

TRACE_KEYS = (
    "round",
    "train_loss",
    "train_data_loss",
    "mean_update_norm",
    "median_update_norm",
    "epsilon",
    "dropped_clients",
    "dropped_client_ids",
    "uplink_gb_total",
    "diverged",
)
EVALUATION_KEYS = ("personalized_accuracy", "client_accuracy")
# The settings that tell a table's runs apart beyond its row (a --set learning rate, model, noise
# mode, rates).
CONFIG_KEYS = (
    "seed",
    "algorithm",
    "model.name",
    "client.learning_rate",
    "cuag.mode",
    "compression.enabled",
    "compression.rates",
    "compression.r_min",
    "compression.r_max",
    "compression.refresh",
    "compression.signs",
    "compression.error_feedback",
    "engine.unroll",
    "cuag.sigma",
    "cuag.sigma_scale",
    "cuag.clip_norm",
    "cuag.adaptive_clip",
    "cuag.count_noise_std",
    "data.source",
    "data.normalize",
    "data.augment",
    "client.grad_clip_norm",
    "pfldyn.server_mean",
    "pfldyn.representation",
)


def run_record(workdir: str, resumed: bool = False) -> dict:
    """``{workdir, row, evaluations, rounds}`` of one run; its split and method from the
    ``rows.json`` that ``seed004_tables.py`` wrote beside it, else from its folder name
    (``acid3-FedAvg``)."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    split, name = names(workdir)
    return {
        "workdir": workdir,
        "row": result_row(workdir, split, name, resumed=resumed),
        "config": config(workdir),
        "evaluations": [r for r in rows if any(k in r for k in EVALUATION_KEYS)],
        "rounds": [{k: r[k] for k in TRACE_KEYS if k in r} for r in rows if "cohort_size" in r],
    }


def config(workdir: str) -> dict:
    """The ``CONFIG_KEYS`` of the run's ``config.json`` (dotted names; a key the run's config lacks
    is left out)."""
    flat = flatten_dict(json.load(open(os.path.join(workdir, "config.json"))), sep=".")
    return {key: flat[key] for key in CONFIG_KEYS if flat.get(key) is not None}


def names(workdir: str) -> tuple[str, str]:
    folder = os.path.basename(os.path.normpath(workdir))
    listed = os.path.join(os.path.dirname(os.path.normpath(workdir)), "rows.json")
    for row in json.load(open(listed)) if os.path.isfile(listed) else []:
        if os.path.basename(os.path.normpath(row["workdir"])) == folder:
            return row["split"], row["method"]
    split, _, name = folder.partition("-")
    return split, name


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out", help="the JSON file to write")
    p.add_argument(
        "workdirs",
        nargs="+",
        help="run folders holding metrics.jsonl, summary.json, privacy.json, config.json",
    )
    p.add_argument(
        "--setting", required=True, help="how the runs were made: command, commit, date, machine"
    )
    p.add_argument("--resumed", action="store_true", help="the runs were resumed from a checkpoint")
    args = p.parse_args(argv)
    missing = [w for w in args.workdirs if not os.path.isfile(os.path.join(w, "summary.json"))]
    if missing:
        p.error(f"no summary.json in {missing}: not a finished or stopped run's folder")
    record = {
        "setting": args.setting,
        # the conversion's own provenance (the runs' machine and versions are in ``setting``)
        "written_by": provenance(),
        "runs": [run_record(w, args.resumed) for w in args.workdirs],
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
