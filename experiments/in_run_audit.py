"""The in-run audit's estimates against the formal epsilon (Andrew et al., "One-shot empirical
privacy estimation for federated learning", ICLR 2024; Steinke, Nasr and Jagielski, "Privacy
auditing with one (1) training run", NeurIPS 2023), on real DP-FedAvg runs with ``audit.canaries``.

Two tables, each row one run (seed) with its formal epsilon, both threat models' epsilon-hat (two
Gaussian fits, and the equal-variance fit) with their 95 % bootstrap intervals, and the one-run
lower bound:

* ``--table every_round``: Gaussian DP-FedAvg where every client takes part in every round (Poisson
  rate 1) and the canaries take part in every round, so the formal guarantee is the unamplified
  composition of the rounds' Gaussians, calibrated to each ``--epsilons`` (RDP). Andrew et al.
  report the all-iterates estimate close to the analytic bound in this setting; each row gives the
  ratio.
* ``--table final_model``: the final-model estimate for independent noise (Poisson sampling) and
  correlated noise (banded, BLT under min-separation sampling), canaries sampled as the clients are
  (``participation=sampled``), against the run's epsilon (PLD): the gap the papers report.

On the embedded MNIST subset by default (no download); ``--set data.source=femnist --set
data.partition=natural --set data.data_dir=...`` for FEMNIST by writer, ``data.source=shakespeare``
for Shakespeare. Raw rows (with provenance) go to ``<out>/audit.json`` after every run.

    python experiments/in_run_audit.py --table every_round --epsilons 2 4 8 --seeds 0 1 2
    python experiments/in_run_audit.py --table final_model --epsilons 2 8
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

NOISES = ("independent", "banded", "blt")


def config(table: str, noise: str, epsilon: float, seed: int, args):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every, c.seed = "dp_fedavg", args.rounds, args.rounds, seed
    c.data.update(partition="iid", num_clients=args.clients)
    c.client.update(epochs=1, batch_size=args.batch, learning_rate=0.1)
    c.dp.clip_norm = args.clip
    c.audit.update(canaries=args.canaries, scale=args.scale)
    if table == "every_round":
        c.sampling.update(method="poisson", rate=1.0)
        c.audit.participation = "every_round"
        c.privacy.update(accountant="rdp", delta=args.delta, target_epsilon=epsilon)
    else:
        if noise == "independent":
            c.sampling.update(method="poisson", rate=args.cohort / args.clients)
        else:
            c.sampling.update(
                method="min_separation",
                min_separation=args.separation,
                cohort_size=args.cohort,
                check_in_rate=args.check_in_rate,
            )
            c.dp.noise = noise
        c.audit.participation = "sampled"
        c.privacy.update(accountant="pld", delta=args.delta, target_epsilon=epsilon)
    apply_overrides(c, args.set)
    return c


def plan(args):
    noises = ["independent"] if args.table == "every_round" else args.noises
    for noise in noises:
        if noise not in NOISES:
            raise ValueError(f"--noises: {noise!r} unknown; choose from {NOISES}")
        for eps in args.epsilons:
            for seed in args.seeds:
                name = f"{args.table}-{noise}-eps{eps:g}-seed{seed}"
                yield name, config(args.table, noise, eps, seed, args), noise, eps, seed


def row(name, workdir, summary, noise, eps, seed):
    with open(os.path.join(workdir, "privacy.json")) as f:
        empirical = json.load(f)["empirical"]
    figures = {
        threat: {
            key: empirical[threat][key]
            for key in (
                "epsilon_hat",
                "interval",
                "epsilon_hat_equal_variance",
                "interval_equal_variance",
                "lower_bound",
                "flagged",
            )
        }
        for threat in ("final_model", "all_iterates")
        if threat in empirical
    }
    formal = empirical["canary_formal_epsilon"]
    return {
        "run": name,
        "noise": noise,
        "epsilon_target": eps,
        "seed": seed,
        "formal_epsilon": formal,
        "run_epsilon": summary.epsilon,
        "canaries": empirical["canaries"],
        "canaries_per_round": empirical["canaries_per_round"],
        "participation": empirical["participation"],
        "accuracy": summary.final.get("test_accuracy"),
        **figures,
        "ratio_to_formal": {
            threat: {
                "epsilon_hat": f["epsilon_hat"] / formal,
                "epsilon_hat_equal_variance": f["epsilon_hat_equal_variance"] / formal,
            }
            for threat, f in figures.items()
        },
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--table", choices=("every_round", "final_model"), default="every_round")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[2, 4, 8])
    parser.add_argument("--noises", nargs="+", default=list(NOISES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--cohort", type=int, default=20, help="final_model: clients a round")
    parser.add_argument("--separation", type=int, default=4)
    parser.add_argument("--check-in-rate", type=float, default=0.5)
    parser.add_argument("--canaries", type=int, default=500, help="audit.canaries (k)")
    parser.add_argument("--scale", type=float, default=1.0, help="audit.scale")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--clip", type=float, default=0.5)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument(
        "--set", action="append", default=[], help="KEY=VALUE config override (repeatable)"
    )
    parser.add_argument("--out", default="results/in_run_audit")
    args = parser.parse_args()
    runs = checked_runs(parser, lambda: plan(args))
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name, cfg, noise, eps, seed in runs:
        workdir = os.path.join(args.out, name)
        summary = Experiment(cfg).run(workdir, overwrite=True, progress=False)
        rows.append(row(name, workdir, summary, noise, eps, seed))
        print(json.dumps(rows[-1]), flush=True)
        with open(os.path.join(args.out, "audit.json"), "w") as f:
            f.write(
                strict_json({"setting": provenance(), "args": vars(args), "rows": rows}, indent=2)
            )


if __name__ == "__main__":
    main()
