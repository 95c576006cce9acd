"""Local vs central client-level DP (seed 001): test accuracy against epsilon at a fixed number of
rounds, on the embedded MNIST subset (no download) or real MNIST (``--data-dir``).

Central: Poisson sampling q, the noise multiplier calibrated with the PLD accountant so that R rounds
spend epsilon at delta. Local: every client clips and adds its own N(0, (z S)^2) (sensitivity 2S: any
two clipped updates differ by at most 2S); z is set so that a client taking part in all R rounds
(the worst case, no amplification) spends epsilon: mu = 2 sqrt(R) / z = mu(epsilon, delta).

    python experiments/local_vs_central.py --out results/local_vs_central
"""

from __future__ import annotations

import argparse
import json
import math
import os

from fedjax_dp.privacy import gdp
from fedjax_dp.privacy.accounting import calibrate_noise_multiplier
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment


def config(mode: str, z: float, args):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = "dp_fedavg", args.rounds, args.rounds
    c.data.partition = "iid"
    if args.data_dir:
        c.data.source, c.data.data_dir, c.data.num_clients, c.data.test_fraction = "mnist", args.data_dir, 1000, 0.0
    c.client.epochs = 1
    c.sampling.method, c.sampling.rate = "poisson", args.rate
    c.dp.noise_mode, c.dp.noise_multiplier, c.dp.clip_norm = mode, z, args.clip
    c.dp.accountant, c.dp.delta = "pld", args.delta
    return c


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1, 2, 4, 8, 16, 64])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--out", default="results/local_vs_central")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for eps in args.epsilons:
        z_central = calibrate_noise_multiplier(eps, args.delta, args.rounds, "poisson", args.rate, kind="pld")
        z_local = 2 * math.sqrt(args.rounds) / gdp.mu_from_epsilon(eps, args.delta)
        for mode, z in (("central", z_central), ("local", z_local)):
            s = run_experiment(config(mode, z, args), os.path.join(args.out, f"{mode}-eps{eps:g}"), overwrite=True,
                               progress=False)
            rows.append({"epsilon_target": eps, "mode": mode, "noise_multiplier": z, "accuracy": s.final["test_accuracy"],
                         "epsilon_spent": s.epsilon})
            print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(args.out, "sweep.json"), "w") as f:
        json.dump(rows, f, indent=2)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in ("central", "local"):
        pts = [(r["epsilon_target"], r["accuracy"]) for r in rows if r["mode"] == mode]
        ax.plot(*zip(*pts), marker="o", label=f"{mode} DP")
    ax.set_xscale("log")
    ax.set_xlabel(f"epsilon (delta = {args.delta:g}), {args.rounds} rounds")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "accuracy_vs_epsilon.png"), dpi=120)
    print("| epsilon | central z | central acc | local z | local acc |\n| --- | --- | --- | --- | --- |")
    for eps in args.epsilons:
        c, l = (next(r for r in rows if r["epsilon_target"] == eps and r["mode"] == m) for m in ("central", "local"))
        print(f"| {eps:g} | {c['noise_multiplier']:.3f} | {c['accuracy']:.4f} | {l['noise_multiplier']:.2f} | {l['accuracy']:.4f} |")


if __name__ == "__main__":
    main()
