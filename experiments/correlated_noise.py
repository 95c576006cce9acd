"""Correlated noise against independent noise at one epsilon (issue 75): DP-FedAvg with Poisson
sampling (amplified) against, under the same b-min-separation participation (clients check in at
random; the server refuses those inside their window), independent noise without amplification
(identity strategy), binary-tree aggregation (DP-FTRL, plain, restarted, Honaker's), banded, BLT and
dense MF, each calibrated (``privacy.target_epsilon``) so that the run spends epsilon; the same
rounds and cohort cap. Test accuracy over several seeds (mean and 95 % t-interval) with each
strategy's prefix-sum noise (RMSE over z S, from ``privacy.json``) and its calibrated z.
``--non-private`` adds FedAvg without clip or noise, ``--clip-only`` the DP runs' clip without noise
(no privacy: ``formal: false``, no epsilon); ``--delta 0`` sets delta = 1/N^1.1. On the embedded
MNIST subset (no download) by default; ``--set data.source=femnist --set data.partition=natural
--set data.data_dir=...`` for FEMNIST by writer, ``data.source=shakespeare`` for Shakespeare by role
(the full commands are in ``RESULTS.md``).

    python experiments/correlated_noise.py --out results/correlated_noise --epsilons 2 4 8 --seeds 0
    1 2
"""

from __future__ import annotations

import argparse
import json
import os

import shared_data  # noqa: F401  (FEDJAX_DP_DATA: the shipped configs' data folder)
from fedjax_dp.experiment import Experiment
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.results import dumps as strict_json
from preflight import apply_overrides, checked_runs
from provenance import provenance

METHODS = (
    "dp_fedavg_poisson",
    "gaussian",
    "tree",
    "tree_restart",
    "tree_honaker",
    "banded",
    "blt",
    "dense",
)
NON_PRIVATE = "fedavg_nonprivate"  # FedAvg without clipping or noise: the ceiling
# the same clip, no noise (z = 0, no privacy): the ceiling the clip leaves
CLIP_ONLY = "dp_fedavg_clip_only"
REFERENCES = (NON_PRIVATE, CLIP_ONLY)


def config(method: str, epsilon: float, args):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = "dp_fedavg", args.rounds, args.rounds
    c.data.partition, c.data.num_clients = "iid", args.clients
    c.client.epochs, c.client.batch_size, c.client.learning_rate = 1, args.batch, 0.1
    if method == NON_PRIVATE:  # the ceiling: a uniform cohort of the cap, no clipping, no noise
        c.algorithm = "fedavg"
        c.sampling.update(method="uniform", cohort_size=args.cohort)
        apply_overrides(c, args.set)
        return c
    if method == CLIP_ONLY:  # a uniform cohort of the cap, clipped at --clip, z = 0
        c.sampling.update(method="uniform", cohort_size=args.cohort)
        c.dp.update(clip_norm=args.clip, noise_multiplier=0.0)
        apply_overrides(c, args.set)
        return c
    if method == "dp_fedavg_poisson":  # the same expected cohort, drawn by Poisson sampling
        c.sampling.update(method="poisson", rate=args.cohort / args.clients)
    else:
        c.sampling.update(
            method="min_separation",
            min_separation=args.separation,
            cohort_size=args.cohort,
            check_in_rate=args.check_in_rate,
        )
        c.dp.noise = method
    c.dp.clip_norm = args.clip
    delta = args.delta or 1.0 / args.clients**1.1  # 0: 1 / N^1.1 (issue 75's choice)
    c.privacy.update(accountant="pld", delta=delta, target_epsilon=epsilon)
    apply_overrides(c, args.set)
    return c


def plan(args):
    if args.non_private:
        yield NON_PRIVATE, config(NON_PRIVATE, 0.0, args), 0.0, NON_PRIVATE
    if args.clip_only:
        yield CLIP_ONLY, config(CLIP_ONLY, 0.0, args), 0.0, CLIP_ONLY
    for eps in args.epsilons:
        if eps <= 0:
            raise ValueError(f"--epsilons: every target epsilon must be > 0, got {eps:g}")
        for method in args.methods:
            if method not in METHODS:
                raise ValueError(f"--methods: {method!r} unknown; choose from {METHODS}")
            yield f"{method}-eps{eps:g}", config(method, eps, args), eps, method


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epsilons", type=float, nargs="+", default=[2, 4, 8])
    parser.add_argument(
        "--methods", nargs="*", default=list(METHODS), help="none: the references only"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--cohort", type=int, default=100)
    parser.add_argument("--separation", type=int, default=4)
    parser.add_argument("--check-in-rate", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--clip", type=float, default=0.5)
    parser.add_argument("--delta", type=float, default=1e-5, help="0: 1 / clients^1.1")
    parser.add_argument(
        "--non-private",
        action="store_true",
        help=f"add {NON_PRIVATE}: uniform cohorts of --cohort, no DP",
    )
    parser.add_argument(
        "--clip-only",
        action="store_true",
        help=f"add {CLIP_ONLY}: the same cohorts clipped at --clip, no noise (no privacy)",
    )
    parser.add_argument(
        "--set", action="append", default=[], help="KEY=VALUE config override (repeatable)"
    )
    parser.add_argument("--out", default="results/correlated_noise")
    args = parser.parse_args()
    runs = checked_runs(parser, lambda: plan(args))
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name, cfg, eps, method in runs:
        s = Experiment(cfg).run_seeds(
            args.seeds, os.path.join(args.out, name), overwrite=True, progress=False
        )
        privacy_path = os.path.join(s.workdirs[0], "privacy.json")
        # the non-private row releases nothing
        privacy = {"noise_multipliers": [0.0], "accounting": {}}
        if method not in REFERENCES:
            with open(privacy_path) as f:
                privacy = json.load(f)
        rows.append(
            {
                "epsilon_target": eps,
                "method": method,
                "noise_multiplier": privacy["noise_multipliers"][0],
                "prefix_sum_rmse_over_z_clip": privacy["accounting"].get(
                    "prefix_sum_rmse_over_z_clip"
                ),
                "seeds": args.seeds,
                "rounds": s.rounds,
                "accuracy": s.final["test_accuracy"],
                "epsilon_spent": s.epsilon,
                "formal": s.formal,
                "config": cfg.to_dict(),
            }
        )
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "config"}), flush=True)
    with open(os.path.join(args.out, "sweep.json"), "w") as f:
        f.write(strict_json({"setting": provenance(), "args": vars(args), "rows": rows}, indent=2))
    print(
        "| epsilon | method | z | prefix RMSE / (z S) | noise RMSE / S | accuracy |\n| --- | --- |"
        " --- | --- | --- | --- |"
    )
    for r in rows:
        rmse, z, a = r["prefix_sum_rmse_over_z_clip"], r["noise_multiplier"], r["accuracy"]
        over_z = "-" if rmse is None else f"{rmse:.2f}"
        over_s = "-" if rmse is None else f"{rmse * z:.2f}"
        eps = "inf" if r["method"] in REFERENCES else f"{r['epsilon_target']:g}"
        print(
            f"| {eps} | {r['method']} | {z:.3f} | {over_z} | {over_s} | "
            f"{a['mean']:.4f} +- {a['ci95_half_width'] or 0:.4f} |"
        )


if __name__ == "__main__":
    main()
