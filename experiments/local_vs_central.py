"""Local vs central client-level DP (seed 001): test accuracy against epsilon at a fixed number of
rounds, on the embedded MNIST subset (no download) or real MNIST (``--data-dir``), over several
seeds (mean and 95 % t-interval).

Central: Poisson sampling q, the noise multiplier calibrated with the PLD accountant so that R
rounds spend epsilon at delta. Local: every client clips and adds its own N(0, (z S)^2) (sensitivity
2S: any two clipped updates differ by at most 2S); z is set so that a client taking part in all R
rounds (the worst case, no amplification) spends epsilon: mu = 2 sqrt(R) / z = mu(epsilon, delta).

    python experiments/local_vs_central.py --out results/local_vs_central --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os

import shared_data  # noqa: F401  (FEDJAX_DP_DATA: the shipped configs' data folder)
from fedjax_dp.experiment import Experiment
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.plots import plot_accuracy_vs_epsilon
from fedjax_dp.training.results import dumps as strict_json
from preflight import checked_runs
from provenance import provenance


def config(mode: str, epsilon: float, args):
    """DP-FedAvg with z calibrated (``privacy.target_epsilon``) so that ``args.rounds`` rounds spend
    ``epsilon``: central, the Poisson event under PLD; local, a client in every round (the library's
    ``dp_section.calibrated_noise_multiplier``)."""
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = "dp_fedavg", args.rounds, args.rounds
    c.data.partition, c.data.num_clients = "iid", args.clients
    if args.data_dir:
        c.data.source, c.data.data_dir, c.data.test_fraction = "mnist", args.data_dir, 0.0
    c.client.epochs, c.client.batch_size = 1, args.batch
    c.sampling.method, c.sampling.rate = "poisson", args.rate
    c.dp.noise_mode, c.privacy.target_epsilon, c.dp.clip_norm = mode, epsilon, args.clip
    c.privacy.accountant, c.privacy.delta = "pld", args.delta
    return c


def plan(args):
    """(name, config, epsilon, mode) of every run (``--seeds`` checked here: each run takes them
    all)."""
    if min(args.seeds) < 0:
        raise ValueError(f"--seeds must be >= 0, got {args.seeds}")
    for eps in args.epsilons:
        if eps <= 0:  # privacy.target_epsilon = 0 would mean "not calibrated"
            raise ValueError(f"--epsilons: every target epsilon must be > 0, got {eps:g}")
        for mode in ("central", "local"):
            yield f"{mode}-eps{eps:g}", config(mode, eps, args), eps, mode


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1, 2, 4, 8, 16, 64])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--rate", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--clip", type=float, default=0.5)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--out", default="results/local_vs_central")
    args = parser.parse_args()
    runs = checked_runs(parser, lambda: plan(args))
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name, cfg, eps, mode in runs:
        s = Experiment(cfg).run_seeds(
            args.seeds, os.path.join(args.out, name), overwrite=True, progress=False
        )
        z = json.load(open(os.path.join(s.workdirs[0], "privacy.json")))["noise_multipliers"]
        rows.append(
            {
                "epsilon_target": eps,
                "mode": mode,
                "noise_multiplier": z[0],
                "seeds": args.seeds,
                "accuracy": s.final["test_accuracy"],
                "epsilon_spent": s.epsilon,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(args.out, "sweep.json"), "w") as f:
        f.write(strict_json({"setting": provenance(), "args": vars(args), "rows": rows}, indent=2))
    points = {
        f"{mode} DP": [
            (r["epsilon_target"], r["accuracy"]["mean"], r["accuracy"]["ci95_half_width"] or 0.0)
            for r in rows
            if r["mode"] == mode
        ]
        for mode in ("central", "local")
    }
    plot_accuracy_vs_epsilon(
        points,
        os.path.join(args.out, "accuracy_vs_epsilon.png"),
        f"DP-FedAvg, {args.rounds} rounds, K={args.clients}, q={args.rate}, S={args.clip}, "
        f"delta={args.delta:g}, {len(args.seeds)} seeds (95 % CI)",
    )
    print(
        "| epsilon | central z | central accuracy | local z | local accuracy |\n| --- | --- | --- |"
        " --- | --- |"
    )
    for eps in args.epsilons:
        c, l = (
            next(r for r in rows if r["epsilon_target"] == eps and r["mode"] == m)
            for m in ("central", "local")
        )
        show = lambda a: f"{a['mean']:.4f} +- {a['ci95_half_width'] or 0:.4f}"  # noqa: E731
        print(
            f"| {eps:g} | {c['noise_multiplier']:.3f} | {show(c['accuracy'])} |"
            f" {l['noise_multiplier']:.2f} | {show(l['accuracy'])} |"
        )


if __name__ == "__main__":
    main()
