"""Distributed DP under a simulated secure aggregation against central DP-FedAvg at one epsilon:
test accuracy against the bit width for the distributed discrete Gaussian (``ddgauss``) and
Skellam, each calibrated (``privacy.target_epsilon``, RDP) so that the run spends epsilon, beside
central Gaussian DP-FedAvg calibrated to the same epsilon by the same accountant; the same rounds,
sampling (Poisson) and clip. Each row also gives the quantisation step gamma, the coordinates
that wrapped around per round and the rounds aborted below the survivor threshold (``--dropout``).
On the embedded MNIST subset by default (DP-FedAvg's shipped setting: 500 IID clients, q = 0.2, 40
rounds); ``--set data.source=femnist --set data.partition=natural --set data.data_dir=...`` for
FEMNIST by writer.

``--dropout-table`` prints, without training, the epsilon a run spends at a fixed noise share per
client when a fraction of the sampled clients drops out (fewer shares survive, so less noise), for
``--dropouts``: the cost of dropouts at fixed noise.

    python experiments/distributed_dp.py --out results/distributed_dp --epsilons 4 10 --seeds 0 1 2
    python experiments/distributed_dp.py --dropout-table --dropouts 0 0.1 0.2 0.5
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import shared_data  # noqa: F401  (FEDJAX_DP_DATA: the shipped configs' data folder)
from fedjax_dp.experiment import Experiment
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.results import dumps as strict_json
from preflight import apply_overrides
from provenance import provenance

MECHANISMS = ("ddgauss", "skellam")
CENTRAL = "central"


def config(method: str, bits: int, epsilon: float, args):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = "dp_fedavg", args.rounds, args.rounds
    c.data.update(partition="iid", num_clients=args.clients)
    c.sampling.update(method="poisson", rate=args.rate)
    c.client.update(epochs=1, batch_size=args.batch, learning_rate=0.1)
    c.dp.clip_norm = args.clip
    c.privacy.update(accountant="rdp", delta=args.delta, target_epsilon=epsilon)
    if method != CENTRAL:
        c.dp.noise_mode = "distributed"
        c.ddp.update(mechanism=method, bits=bits, dropout=args.dropout)
    apply_overrides(c, args.set)
    return c


def plan(args):
    for eps in args.epsilons:
        yield f"{CENTRAL}-eps{eps:g}", config(CENTRAL, 0, eps, args), eps, CENTRAL, None
        for method in args.methods:
            if method not in MECHANISMS:
                raise ValueError(f"--methods: {method!r} unknown; choose from {MECHANISMS}")
            for bits in args.bits:
                name = f"{method}-{bits}bits-eps{eps:g}"
                yield name, config(method, bits, eps, args), eps, method, bits


def feasible(parser, planned):
    """The planned runs whose config validates, and a row for each that cannot reach its target
    (too few bits for the dimension's rounding, say: its reason recorded, not run)."""
    runs, infeasible = [], []
    for name, cfg, eps, method, bits in planned():
        try:
            validate_config(cfg)
        except ValueError as error:
            if method == CENTRAL:
                parser.error(f"{name}: {error}")
            reason = str(error).replace("invalid configuration:\n  - ", "")
            infeasible.append(
                {"epsilon_target": eps, "method": method, "bits": bits, "infeasible": reason}
            )
            continue
        runs.append((name, cfg, eps, method, bits))
    return runs, infeasible


def round_stats(workdir: str) -> dict:
    """Mean wrapped coordinates and aborted rounds over a run's rounds (``metrics.jsonl``)."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    rows = [r for r in rows if r.get("round", 0) > 0 and "ddp_wrapped" in r]
    if not rows:
        return {}
    return {
        "wrapped_per_round": float(np.mean([r["ddp_wrapped"] for r in rows])),
        "aborted_rounds": int(sum(r["ddp_aborted"] for r in rows)),
        "survivors_per_round": float(np.mean([r["ddp_survivors"] for r in rows])),
    }


def dropout_table(args) -> None:
    """Epsilon at a fixed noise share per client as dropouts thin the surviving shares."""
    from fedjax_dp.algorithms import ddp_section
    from fedjax_dp.algorithms.dp_section import calibrated_noise_multiplier, noise_releases
    from fedjax_dp.privacy.accounting.accountant import Accountant
    from fedjax_dp.privacy.sampling import build as client_sampler

    rows = []
    for method in args.methods:
        base = config(method, args.bits[0], args.epsilons[0], args)
        base.ddp.dropout = 0.0
        z = calibrated_noise_multiplier(base, args.clients)
        sampler = client_sampler(base.sampling, args.clients)
        share = z / np.sqrt(ddp_section.survivor_threshold(base, sampler))  # sigma / (z c) at 0
        for dropout in args.dropouts:
            c = config(method, args.bits[0], 0.0, args)
            c.privacy.target_epsilon, c.ddp.dropout = 0.0, dropout
            survivors = ddp_section.survivor_threshold(c, client_sampler(c.sampling, args.clients))
            z_at = share * np.sqrt(survivors)  # the same share: the surviving sum's multiplier
            (release,) = noise_releases(c, args.clients, z_at)
            accountant = Accountant("rdp").compose(
                sampler.round_event(release.event, 1), args.rounds
            )
            rows.append(
                {
                    "method": method,
                    "bits": args.bits[0],
                    "dropout": dropout,
                    "min_survivors": survivors,
                    "noise_multiplier_of_the_survivors": float(z_at),
                    "epsilon": accountant.epsilon(args.delta),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "dropout_table.json"), "w") as f:
            f.write(strict_json({"setting": provenance(), "args": vars(args), "rows": rows}))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epsilons", type=float, nargs="+", default=[4, 10])
    parser.add_argument("--methods", nargs="*", default=list(MECHANISMS))
    parser.add_argument("--bits", type=int, nargs="+", default=[8, 10, 12, 14, 16, 18])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--rate", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--clip", type=float, default=0.5)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--dropout-table", action="store_true")
    parser.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.5])
    parser.add_argument(
        "--set", action="append", default=[], help="KEY=VALUE config override (repeatable)"
    )
    parser.add_argument("--out", default="results/distributed_dp")
    args = parser.parse_args()
    if args.dropout_table:
        dropout_table(args)
        return
    runs, infeasible = feasible(parser, lambda: plan(args))
    os.makedirs(args.out, exist_ok=True)
    rows = list(infeasible)
    for row in infeasible:
        print(json.dumps(row), flush=True)
    for name, cfg, eps, method, bits in runs:
        s = Experiment(cfg).run_seeds(
            args.seeds, os.path.join(args.out, name), overwrite=True, progress=False
        )
        with open(os.path.join(s.workdirs[0], "privacy.json")) as f:
            privacy = json.load(f)
        stats = [round_stats(w) for w in s.workdirs]
        rows.append(
            {
                "epsilon_target": eps,
                "method": method,
                "bits": bits,
                "noise_multiplier": privacy["noise_multipliers"][0]
                if privacy["noise_multipliers"]
                else privacy["releases"][0]["noise_multiplier"],
                "gamma": privacy["accounting"].get("ddp_gamma"),
                "seeds": args.seeds,
                "rounds": s.rounds,
                "accuracy": s.final["test_accuracy"],
                "epsilon_spent": s.epsilon,
                "formal": s.formal,
                "per_seed_round_stats": stats,
                "config": cfg.to_dict(),
            }
        )
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "config"}), flush=True)
        # after every row: a long grid stopped part-way keeps what it ran
        with open(os.path.join(args.out, "sweep.json"), "w") as f:
            f.write(
                strict_json({"setting": provenance(), "args": vars(args), "rows": rows}, indent=2)
            )
    print("| epsilon | method | bits | z | gamma | wrapped / round | accuracy |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "infeasible" in r:
            print(
                f"| {r['epsilon_target']:g} | {r['method']} | {r['bits']} | - | - | - |"
                f" cannot reach the target: {r['infeasible'][:80]} |"
            )
            continue
        a, stats = r["accuracy"], [s for s in r["per_seed_round_stats"] if s]
        wrapped = f"{np.mean([s['wrapped_per_round'] for s in stats]):.1f}" if stats else "-"
        gamma = "-" if r["gamma"] is None else f"{r['gamma']:.3g}"
        print(
            f"| {r['epsilon_target']:g} | {r['method']} | {r['bits'] or '-'} |"
            f" {r['noise_multiplier']:.3f} | {gamma} | {wrapped} |"
            f" {a['mean']:.4f} +- {a['ci95_half_width'] or 0:.4f} |"
        )


if __name__ == "__main__":
    main()
