"""The GPU grid of issue 78: one command per experiment this project could not afford on its 2-core
CPU, ready for the day a GPU is at hand. Each cell runs an existing experiment script into
``--out/<cell>``, resumes where it stopped (the scripts' ``--resume`` / ``--reuse``: checkpoints
every 25 rounds), and on finishing writes its raw rows to ``--rows/<cell>.json`` (every run's
config, summary and per-round metrics, with the command, commit, date and machine); a cell whose raw
rows exist is skipped.

    python experiments/grids/gpu_grid.py --list                     # the cells and their estimated
    GPU time python experiments/grids/gpu_grid.py --only t2_paper_scale0.5_s0 --data-root
    ../shared/data python experiments/grids/gpu_grid.py --budget 3600 --data-root
    ../shared/data    # as many cells as fit

Cells (seeds 0, 1, 2 each):
  seed 004, Table 2 at 300 rounds (CIFAR-10 ACID3): CUAG-PFL paper mode with Alg. 4's sigma x 1,
    1/2, 1/4, 1/8, 1/16 (``cuag.sigma_scale``), with sigma fixed at 0.45, the sound mode,
    compression alone, PFLDyn(Proto), FedAvg scored by prototype adaptation as SCAFFOLD is
    (``eval_prototypes``; the global model's accuracy beside it), and PFLDyn(Proto) and paper mode
    on the PFLDyn authors' 0.8M-parameter CNN (``model.name=cnn_pfl_authors``), all in the seed's
    pipeline (``t2_*``); the noise sweep and the larger-CNN cells again in the authors' pipeline
    with crop-and-flip augmentation (``t2a_*``, ``AUTHORS_PIPELINE``), where the headline rows
    were measured;
  seed 002 at the paper's scale: FEMNIST (E = 5, B = 64, lr 0.002, 500 rounds) for every method,
    UGA's server rate eta_g swept over 0.002, 0.01, 0.05, 0.2, 1 and
    ``uga.gradient_reduction=sum_of_batch_means``, CIFAR-10's Table 1 at the paper's lr 0.002 for
    100 rounds in its three (E, B) settings (the one-seed GPU run of 2026-11 has no raw row), and
    Shakespeare (300 rounds).
The time estimates (``ESTIMATE_NOTE``) are arithmetic from the recorded GPU runs, not measurements
of these cells.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXPERIMENTS = os.path.dirname(HERE)
sys.path.insert(0, EXPERIMENTS)

from provenance import provenance  # noqa: E402

ESTIMATE_NOTE = (
    "Estimates, H100 / H200, one process: the CNN rounds of seed 004 from UDP's 300 rounds in 130 s"
    " on an H200 beside three other runs (RESULTS.md, 'The DP baselines'), so ~0.2-0.45 s a round:"
    " ~2-3 min a 300-round CNN cell with its evaluations (the authors' 0.8M CNN: ~11x the"
    " parameters, estimated ~2x the time); seed 002's CIFAR-10 runs took 31-207 s for 100 rounds"
    " three to a GPU (H100), FEMNIST / Shakespeare have no GPU run: estimated from their CPU"
    " seconds a round (17-43 s FEMNIST, 18-71 s Shakespeare) at a CPU-to-GPU ratio of ~20x (the"
    " CIFAR-10 runs: ~40x three to a GPU)."
)


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    script: str
    argv: tuple[str, ...]
    minutes: float  # the estimate (ESTIMATE_NOTE)
    resume_flag: str  # the script's resume option


# What ``cuag_pfl_cifar10:authors`` sets (the PFLDyn authors' code: standardised inputs, local clip
# 10, population-mean g, penultimate prototypes), with the crop-and-flip augmentation of the
# headline Table 2 rows (experiments/README.md): the pipeline those rows were run in.
AUTHORS_PIPELINE = (
    "data.normalize=channel",
    "client.grad_clip_norm=10.0",
    "pfldyn.server_mean=population",
    "pfldyn.representation=penultimate",
    "data.augment=crop_flip",
)
# Augmented batches and standardisation: estimated 1.5x a cell's time in the seed's pipeline.
AUTHORS_COST = 1.5


def seed004_cells() -> list[Cell]:
    base = ("--table", "2", "--rounds", "300", "--eval-every", "10", "--checkpoint-every", "25")
    paper = ("--only", "CUAG-PFL (paper mode, mu 0.25)")
    noise_sweep = [
        (f"paper_scale{scale:g}", paper, (f"cuag.sigma_scale={scale:g}",), 3)
        for scale in (1, 0.5, 0.25, 0.125, 0.0625)
    ] + [("paper_sigma0.45", paper, ("cuag.sigma=0.45",), 3)]
    larger_cnn = [
        ("pfldyn_authors_cnn", ("--only", "PFLDyn(Proto)"), ("model.name=cnn_pfl_authors",), 6),
        ("paper_authors_cnn", paper, ("model.name=cnn_pfl_authors",), 6),
    ]
    seeds_pipeline = (
        noise_sweep
        + [
            ("sound", ("--only", "CUAG-PFL (sound mode, mu 0.25)"), (), 3),
            ("compression_alone", paper, ("cuag.mode=none",), 3),
            ("pfldyn", ("--only", "PFLDyn(Proto)"), (), 3),
            ("fedavg_prototypes", ("--only", "FedAvg"), ("eval_prototypes=True",), 4),
        ]
        + larger_cnn
    )
    # t2_*: the seed's pipeline; t2a_*: the noise sweep and the larger CNN in the authors'
    # pipeline, where the headline rows were measured, so that they answer the same question.
    variants = [(f"t2_{name}", only, sets, minutes) for name, only, sets, minutes in seeds_pipeline]
    variants += [
        (f"t2a_{name}", only, sets + AUTHORS_PIPELINE, minutes * AUTHORS_COST)
        for name, only, sets, minutes in noise_sweep + larger_cnn
    ]
    return [
        Cell(
            f"{name}_s{seed}",
            "seed004_tables.py",
            base + only + ("--seed", str(seed)) + (("--set", *sets) if sets else ()),
            minutes,
            "--resume",
        )
        for name, only, sets, minutes in variants
        for seed in (0, 1, 2)
    ]


def seed002_cells() -> list[Cell]:
    femnist = (
        "--dataset",
        "femnist",
        "--rounds",
        "500",
        "--eval-every",
        "10",
        "--set",
        "client.epochs=5",
        "client.batch_size=64",
        "client.learning_rate=0.002",
        "fedmeta.learning_rate=0.002",
    )
    cells = []
    for seed in (0, 1, 2):
        s = ("--seed", str(seed))
        cells.append(
            Cell(
                f"s002_femnist_all_s{seed}",
                "seed002_tables.py",
                femnist + s + ("--eta-g", "0.002"),
                60,
                "--reuse",
            )
        )
        for eta in (0.01, 0.05, 0.2, 1.0):
            cells.append(
                Cell(
                    f"s002_femnist_uga_eta{eta:g}_s{seed}",
                    "seed002_tables.py",
                    femnist + s + ("--eta-g", f"{eta:g}", "--methods", "uga", "fedmeta_uga"),
                    35,
                    "--reuse",
                )
            )
        cells.append(
            Cell(
                f"s002_femnist_uga_sum_of_batch_means_s{seed}",
                "seed002_tables.py",
                femnist
                + ("uga.gradient_reduction=sum_of_batch_means",)
                + s
                + ("--eta-g", "0.002", "--methods", "uga", "fedmeta_uga"),
                35,
                "--reuse",
            )
        )
        for epochs, batch in ((1, 16), (1, 64), (5, 64)):  # Table 1's three (E, B) settings
            cells.append(
                Cell(
                    f"s002_cifar10_e{epochs}b{batch}_s{seed}",
                    "seed002_tables.py",
                    ("--dataset", "cifar10", "--rounds", "100", "--eval-every", "10")
                    + ("--set", f"client.epochs={epochs}", f"client.batch_size={batch}")
                    + s,
                    10 if epochs == 1 else 25,
                    "--reuse",
                )
            )
        cells.append(
            Cell(
                f"s002_shakespeare_all_s{seed}",
                "seed002_tables.py",
                ("--dataset", "shakespeare", "--rounds", "300", "--eval-every", "10") + s,
                60,
                "--reuse",
            )
        )
    return cells


CELLS = seed004_cells() + seed002_cells()


def command(cell: Cell, out: str, data_root: str) -> list[str]:
    data = {"seed004_tables.py": ("--data-dir", os.path.join(data_root, "cifar10"))}.get(
        cell.script, ()
    )
    folder = ("--out", os.path.join(out, cell.name))
    return [
        sys.executable,
        os.path.join(EXPERIMENTS, cell.script),
        *cell.argv,
        *data,
        *folder,
        cell.resume_flag,
    ]


def raw_rows(folder: str) -> list[dict]:
    """Every run under ``folder`` (a directory holding ``metrics.jsonl``): its config, summary and
    metrics."""
    runs = []
    for root, _, files in sorted(os.walk(folder)):
        if "metrics.jsonl" in files and "summary.json" in files:
            read = lambda name: json.load(open(os.path.join(root, name)))  # noqa: E731
            runs.append(
                {
                    "workdir": os.path.relpath(root, folder),
                    "config": read("config.json"),
                    "summary": read("summary.json"),
                    "metrics": [
                        json.loads(line) for line in open(os.path.join(root, "metrics.jsonl"))
                    ],
                }
            )
    return runs


def run_script(cmd: list[str], env: dict) -> int:
    """The cell's experiment script, in a process of its own; its exit status."""
    return subprocess.run(cmd, env=env).returncode


def run_cell(cell: Cell, args) -> bool:
    """Runs (or resumes) ``cell``; writes its raw rows once its script finished. True when it
    finished."""
    env = {**os.environ, "FEDJAX_DP_DATA": args.data_root}
    cmd = command(cell, args.out, args.data_root)
    print(f"[{cell.name}] {' '.join(cmd)}", flush=True)
    status = run_script(cmd, env)
    if status != 0:
        print(
            f"[{cell.name}] stopped with status {status}; the same command resumes it", flush=True
        )
        return False
    os.makedirs(args.rows, exist_ok=True)
    with open(os.path.join(args.rows, cell.name + ".json"), "w") as f:
        json.dump(
            {
                "setting": {**provenance(), "cell": cell.name, "command": " ".join(cmd)},
                "runs": raw_rows(os.path.join(args.out, cell.name)),
            },
            f,
        )
    return True


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="print the cells, their estimates and state, run nothing",
    )
    p.add_argument("--only", nargs="*", default=[], help="cells named so (or starting so)")
    p.add_argument(
        "--budget", type=float, default=0, help="start no cell past this many seconds (0: no limit)"
    )
    p.add_argument("--data-root", default=os.path.join(EXPERIMENTS, "..", "..", "shared", "data"))
    p.add_argument("--out", default="results/gpu_grid")
    p.add_argument("--rows", default=os.path.join(EXPERIMENTS, "raw_rows", "gpu_grid"))
    args = p.parse_args(argv)
    unknown = [o for o in args.only if not any(c.name.startswith(o) for c in CELLS)]
    if unknown:
        p.error(f"--only: no cell is named {unknown[0]!r}; --list shows them")
    cells = [c for c in CELLS if not args.only or any(c.name.startswith(o) for o in args.only)]
    done = lambda c: os.path.exists(os.path.join(args.rows, c.name + ".json"))  # noqa: E731
    if args.list:
        for c in cells:
            print(f"{c.name:45s} ~{c.minutes:g} min  {'done' if done(c) else 'to run'}")
        print(
            f"{len(cells)} cells, ~{sum(c.minutes for c in cells if not done(c)) / 60:.1f} GPU"
            " hours left. " + ESTIMATE_NOTE
        )
        return cells
    start = time.monotonic()
    for c in cells:
        if done(c):
            continue
        if args.budget and time.monotonic() - start + 60 * c.minutes > args.budget:
            print(f"[{c.name}] not started: its estimate passes --budget", flush=True)
            continue
        run_cell(c, args)
    return cells


if __name__ == "__main__":
    main(sys.argv[1:])
