"""Seed 004 (CUAG-PFL) tables: each table is a list of variants of
``fedjax_dp/configs/cuag_pfl_cifar10.py`` (the paper's setting: N = 100, lambda = 0.1, P = 25, B =
50, beta = 0.1, alpha = 0.1, lr decay 0.997, weight decay 1e-3, CNN ``cnn_pfl``), run for
``--rounds`` rounds (300 in the paper) on ``--splits``.

  --table 1   the epsilon each DP method had spent when it first reached the DP baselines' best
              accuracies, read from Table 2 runs (``--rows results/.../rows.json``; runs nothing)
  --table 2   CUAG-PFL paper / sound, PFLDyn(Proto), SCAFFOLD, FedAvg, and the DP baselines
              PriFedSync, UDP (paper calibration and sound), DP-SCAFFOLD (median clip as the seed,
              fixed clip) (Table 2; FedAvg, UDP and SCAFFOLD run E = 5 epochs of B = 50, the same
              2,500 examples per client and round as P = 25 pairs of 50; DP-SCAFFOLD runs K = 25
              DP-SGD steps of B = 50: per-example gradients cost more, and the seed's P is 25)
  --table 6   dynamic rates vs fixed 0.5 / 0.4 / 0.3 (CUAG paper mode)
  --table 7   block vs gaussian vs bernoulli measurement matrices (CUAG paper mode)
  --table 5   Alg. 4's noise N(0, (2 C sigma / B)^2) with sigma in {0.45, 0.65, 1.0, the sigma_t
              schedule} x C in {0.5, 1, 1.5 (clipped first: sound mode, a formal but large epsilon),
              the layer's own norm (paper mode, no guarantee)} (``cuag.sigma``); and, not in the
              paper, the sound counterpart of the adaptive C: each layer's C_l following the median
              of its norms by a private quantile estimate (``cuag.adaptive_clip``, counts noised by
              each client, accounted)
  --table 3   mu in {0.1, 0.15, 0.2, 0.5, 1, 2} (paper and sound modes; ``--mus`` runs other values,
              such as the larger mu the sound mode needs to train at all)
  --table 8   heterogeneous mu_n, 100 values evenly spaced in [0.1, 4] (paper and sound modes)

Every row carries the accuracy (mean personalised test accuracy over all clients, as the seed scores
the personalised methods, SCAFFOLD and DP-SCAFFOLD by the prototype adaptation of their global
model; for FedAvg and UDP the global model's mean accuracy on each client's test data, which the
SCAFFOLD rows also give as ``global_final``), uplink GB measured and scaled to
300 rounds, and the epsilon actually spent (sound mode) or ``no formal guarantee`` beside the
paper's claimed epsilon (paper mode). Writes ``rows.json`` and ``table.md`` under ``--out``.

    python experiments/seed004_tables.py --table 2 --rounds 30 --out results/seed004_t2

Each run checkpoints every ``--checkpoint-every`` rounds; the same command with ``--resume``
continues every row that has a checkpoint under ``--out`` (bit-exactly, as an uninterrupted run) and
starts the others, so a 300-round table on a CPU can be run over several sittings.
"""

from __future__ import annotations

import argparse
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

import shared_data  # noqa: F401, E402  (FEDJAX_DP_DATA: the shipped configs' data folder)
from fedjax_dp.configs import cuag_pfl_cifar10  # noqa: E402

from fedjax_dp.training.checkpointing import Checkpointer  # noqa: E402
from fedjax_dp.training.loop import run_experiment  # noqa: E402
from fedjax_dp.training.compilation_cache import use_persistent_cache  # noqa: E402
from fedjax_dp.training.results import dropped_updates  # noqa: E402
from fedjax_dp.training.results import dumps as strict_json  # noqa: E402
from preflight import apply_overrides, checked_runs  # noqa: E402
from provenance import write_provenance  # noqa: E402

BASELINE = {"client.epochs": 5, "compression.enabled": False}
DP_SCAFFOLD = {"dp_scaffold.local_steps": 25, "compression.enabled": False}
# Seed 004 §7.2 scores SCAFFOLD and DP-SCAFFOLD by each client's personalised model: the prototype
# adaptation
# of the global model (the PFLDyn authors' "Proto A."); the global model's own accuracy stays in the
# row.
PERSONALISED = {"eval_prototypes": True}
# Table 7's random matrices held in memory for a round (cnn_pfl on CIFAR-10: ~8.7 GB at r = 0.5,
# mostly the
# dense layer's 32,768 x 65,536); regenerated at every product instead, a round took hours.
RANDOM_MATRICES_GB = 12.0
# Table 5's sound counterpart of "adaptive C": sigma_b of each client's local per-layer counts
# (cuag.adaptive_clip).
QUANTILE_COUNT_NOISE = 1.0


PAPER_MUS = (0.1, 0.15, 0.2, 0.5, 1.0, 2.0)  # Table 3's mu values


def table_variants(table: int, mus=PAPER_MUS) -> list[tuple[str, dict]]:
    if table == 2:
        return [
            ("CUAG-PFL (paper mode, mu 0.25)", {}),
            ("CUAG-PFL (sound mode, mu 0.25)", {"cuag.mode": "sound"}),
            (
                "CUAG-PFL (sound mode, sigma_t shape, mu 0.25)",
                {"cuag.mode": "sound", "cuag.sound_noise": "sigma_t"},
            ),
            ("PFLDyn(Proto)", {"algorithm": "pfldyn_proto", "compression.enabled": False}),
            (
                "SCAFFOLD",
                {"algorithm": "scaffold", "model.name": "cnn_pfl", **BASELINE, **PERSONALISED},
            ),
            ("FedAvg", {"algorithm": "fedavg", **BASELINE}),
            (
                "PriFedSync (sigma 0.45, C 1)",
                {"algorithm": "prifedsync", "compression.enabled": False},
            ),
            ("UDP (paper calibration, epsilon 10)", {"algorithm": "udp", **BASELINE}),
            ("UDP (sound, epsilon 10)", {"algorithm": "udp", "udp.mode": "sound", **BASELINE}),
            (
                "DP-SCAFFOLD (median clip, sigma 1)",
                {"algorithm": "dp_scaffold", **DP_SCAFFOLD, **PERSONALISED},
            ),
            (
                "DP-SCAFFOLD (fixed clip 1, sigma 1)",
                {
                    "algorithm": "dp_scaffold",
                    "dp_scaffold.clip": "fixed",
                    **DP_SCAFFOLD,
                    **PERSONALISED,
                },
            ),
        ]
    if table == 6:
        return [("dynamic [0.2, 0.5]", {})] + [
            (f"fixed {r}", {"compression.rates": r}) for r in ("0.5", "0.4", "0.3")
        ]
    if table == 7:
        return [("block", {"compression.kind": "block"})] + [
            (kind, {"compression.kind": kind, "compression.materialize_gb": RANDOM_MATRICES_GB})
            for kind in ("gaussian", "bernoulli")
        ]
    if table == 5:  # Alg. 4's noise N(0, (2 C sigma / B)^2), sigma and C each fixed or adaptive
        rows = []
        for sigma in ("0.45", "0.65", "1.0", "schedule"):
            name = "adaptive sigma_t" if sigma == "schedule" else f"sigma {sigma}"
            rows += [
                (f"{name}, C {c}", {"cuag.mode": "sound", "cuag.sigma": sigma, "cuag.clip_norm": c})
                for c in (0.5, 1.0, 1.5)
            ]
            rows.append(
                (f"{name}, adaptive C_l (own norm)", {"cuag.mode": "paper", "cuag.sigma": sigma})
            )
            # adaptive C with a guarantee
            rows.append(
                (
                    f"{name}, private quantile C_l (sound; not in the paper)",
                    {
                        "cuag.mode": "sound",
                        "cuag.sigma": sigma,
                        "cuag.clip_norm": 1.0,
                        "cuag.adaptive_clip": True,
                        "cuag.count_noise_std": QUANTILE_COUNT_NOISE,
                    },
                )
            )
        return rows
    if table == 3:
        return [
            (f"{mode} mode, mu {mu}", {"cuag.mode": mode, "cuag.mu": mu})
            for mode in ("paper", "sound")
            for mu in mus
        ]
    if table == 8:
        return [
            (f"{mode} mode, mu_n in [0.1, 4]", {"cuag.mode": mode, "cuag.client_mu": "0.1:4"})
            for mode in ("paper", "sound")
        ]
    raise ValueError(f"--table {table} unknown; choose 2, 3, 5, 6, 7 or 8")


def split_overrides(split: str) -> dict:
    """``acid3`` / ``alid5`` ... -> the data partition and classes per client."""
    kind, classes = split[:4], split[4:]
    if kind not in ("acid", "alid") or not classes.isdigit():
        raise ValueError(f"split {split!r}: use acidN or alidN (N classes per client)")
    classes = int(classes)
    return {"data.partition": kind, "data.classes_per_client": classes}


def configure(args, overrides: dict, sets=()):
    c = cuag_pfl_cifar10.get_config()
    c.rounds, c.eval_every, c.seed = (
        args.rounds,
        args.eval_every or max(1, args.rounds // 6),
        args.seed,
    )
    c.data.source = args.source
    if args.data_dir:
        c.data.data_dir = args.data_dir
    elif args.source != "cifar10":
        c.data.data_dir = c.data.data_dir.replace("cifar10", args.source)
    c.update_from_flattened_dict(overrides)
    apply_overrides(c, sets)  # last: --set's items (model.name=vgg16) apply to every variant
    return c


def plan_runs(args) -> list[tuple[str, object, str, str]]:
    """(label, config, split, variant name) of every run asked for; a ValueError names a bad split
    or table, or an --only that matches nothing."""
    every = table_variants(args.table, args.mus)
    names = [name for name, _ in every]
    variants = [
        (name, o)
        for name, o in every
        if not args.only or any(selects(text, name, names) for text in args.only)
    ]
    if not variants:
        raise ValueError(
            f"--only {args.only} matches no variant of table {args.table}; its variants: {names}"
        )
    return [
        (f"{split} / {name}", run_config(args, split, overrides), split, name)
        for split in args.splits
        for name, overrides in variants
    ]


def selects(text: str, name: str, names: list[str]) -> bool:
    """--only's rule: a text that is one of the table's variant ``names`` selects that variant alone
    ("SCAFFOLD", not the DP-SCAFFOLD rows); any other text selects every variant whose name contains
    it."""
    return text == name if text in names else text in name


def run_config(args, split: str, overrides: dict):
    cfg = configure(args, {**split_overrides(split), **overrides}, args.set)
    cfg.checkpoint_every = args.checkpoint_every
    return cfg


def run(args, cfg, split: str, name: str) -> dict:
    workdir = os.path.join(
        args.out, f"{split}-{''.join(ch if ch.isalnum() else '_' for ch in name)[:60]}"
    )
    resume = args.resume and bool(Checkpointer(os.path.join(workdir, "checkpoints")).rounds())
    if args.resume and not resume and os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        print(
            f"--resume: {workdir} has no checkpoint; its run starts again from round 0", flush=True
        )
    run_experiment(cfg, workdir, overwrite=not resume, progress=False, resume=resume)
    return result_row(workdir, split, name, resumed=resume)


def result_row(workdir: str, split: str, name: str, resumed: bool = False) -> dict:
    """One table row from a finished run's results directory (``summary.json``, ``metrics.jsonl``,
    ``privacy.json``): the same row whether the run went through in one go or was resumed (then
    ``seconds`` is the last segment's only, and the row says ``resumed``)."""
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    evaluated = [r for r in rows if "personalized_accuracy" in r or "client_accuracy" in r]
    key = "personalized_accuracy" if "personalized_accuracy" in evaluated[-1] else "client_accuracy"
    privacy = json.load(open(os.path.join(workdir, "privacy.json")))
    claim = privacy.get("epsilons", {}).get("paper_claim")
    rounds = summary["rounds"]
    model = json.load(open(os.path.join(workdir, "config.json")))["model"]["name"]
    return {
        "split": split,
        "method": name,
        "model": model,
        "backend": summary.get("backend"),
        "rounds": rounds,
        "metric": key,
        "final": evaluated[-1][key],
        "best": max(r[key] for r in evaluated),
        "global_final": evaluated[-1].get("client_accuracy"),
        "uplink_gb": summary["uplink_gb"],
        "uplink_gb_300_rounds": summary["uplink_gb"] * 300 / max(rounds, 1),
        "epsilon": privacy.get("epsilon"),
        "formal": privacy.get("formal"),
        "paper_claim_epsilon": claim,
        "stop_reason": summary["stop_reason"],
        "seconds": round(summary["seconds"], 1),
        "resumed": resumed,
        "dropped_updates": dropped_updates(rows),
        "client_updates": summary.get("client_updates"),
        "workdir": workdir,
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        (
            "| split | method | rounds | accuracy (final / best) | uplink GB (run / per 300 rounds)"
            " | epsilon spent | paper's claim | time (s) |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["epsilon"] is None:
            eps = "- (no DP)"
        elif r["formal"]:
            eps = f"{r['epsilon']:.3f} (formal)"
        else:
            eps = f"no formal guarantee (formula: {r['epsilon']:.3f})"
        claim = "-" if r["paper_claim_epsilon"] is None else f"{r['paper_claim_epsilon']:.2f}"
        dropped = (
            f" ({r['dropped_updates']} of {r['client_updates']} updates dropped)"
            if r.get("dropped_updates")
            else ""
        )
        lines.append(
            f"| {r['split']} | {r['method']} | {r['rounds']} | {r['final']:.4f} /"
            f" {r['best']:.4f}{dropped} | {r['uplink_gb']:.4f} / {r['uplink_gb_300_rounds']:.4f} |"
            f" {eps} | {claim} | {r['seconds']} |"
        )
    return "\n".join(lines) + "\n"


def epsilon_at(workdir: str, metric: str, target: float):
    """The epsilon recorded when ``metric`` first reached ``target`` (None if it never did)."""
    for row in (json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))):
        if row.get(metric) is not None and row[metric] >= target:
            return row.get("epsilon")
    return None


def table1_markdown(rows: list[dict]) -> str:
    """Seed 004 Table 1: the epsilon each DP method had spent when its accuracy first reached each
    target, the targets being the best accuracies of the DP baselines (the paper: UDP, DP-SCAFFOLD,
    PriFedSync)."""
    private = [r for r in rows if r["epsilon"] is not None]
    targets = sorted(
        {r["best"] for r in private if r["method"].startswith(("UDP", "DP-SCAFFOLD", "PriFedSync"))}
    )
    lines = [
        "| split | method | " + " | ".join(f"epsilon at {t:.4f}" for t in targets) + " |",
        "| --- | --- | " + " | ".join("---" for _ in targets) + " |",
    ]
    for r in private:
        cells = []
        for t in targets:
            eps = epsilon_at(r["workdir"], r["metric"], t)
            cells.append(
                "not reached"
                if eps is None
                else f"{eps:.3f}" + ("" if r["formal"] else " (no formal guarantee)")
            )
        lines.append(f"| {r['split']} | {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    use_persistent_cache()  # the cells' programs, compiled once across cells and runs
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--table", type=int, default=2)
    p.add_argument("--splits", nargs="+", default=["acid3"])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--source", default="cifar10", choices=["cifar10", "cifar100"])
    p.add_argument("--data-dir", default="")
    p.add_argument(
        "--only",
        nargs="*",
        default=[],
        help="run only the variants named exactly so, or else whose name contains one of these",
    )
    p.add_argument(
        "--mus",
        nargs="+",
        type=float,
        default=PAPER_MUS,
        help="--table 3: the mu values (default: the paper's six)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        help=(
            "config overrides for every run, applied last, e.g. model.name=vgg16 (Tables 4 and 6's"
            " VGG16 rows)"
        ),
    )
    p.add_argument("--out", default="results/seed004")
    p.add_argument(
        "--rows",
        nargs="*",
        default=[],
        help="--table 1: the rows.json files of Table 2 runs to read",
    )
    p.add_argument(
        "--checkpoint-every", type=int, default=10, help="checkpoint each run every k rounds"
    )
    p.add_argument(
        "--eval-every", type=int, default=0, help="evaluate every k rounds (0: rounds // 6)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help=(
            "continue each run from its newest checkpoint under --out (a run without one starts"
            " afresh)"
        ),
    )
    args = p.parse_args()
    if args.table == 1:
        os.makedirs(args.out, exist_ok=True)
        rows = [row for path in args.rows for row in json.load(open(path))]
        with open(os.path.join(args.out, "table1.md"), "w") as f:
            f.write(table1_markdown(rows))
        print(table1_markdown(rows))
        return
    runs = checked_runs(p, lambda: plan_runs(args))
    os.makedirs(args.out, exist_ok=True)
    write_provenance(args.out)
    rows = []
    for _, cfg, split, name in runs:
        rows.append(run(args, cfg, split, name))
        print(json.dumps(rows[-1]), flush=True)
        with open(os.path.join(args.out, "rows.json"), "w") as f:
            f.write(strict_json(rows, indent=2))
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(markdown(rows))


if __name__ == "__main__":
    main()
