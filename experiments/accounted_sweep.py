"""What tuning costs once its selection is accounted (Papernot and Steinke, "Hyperparameter tuning
with Renyi differential privacy", ICLR 2022): a clip-norm x server-learning-rate sweep of DP-FedAvg
whose released (best) model spends a total budget ``--epsilon``, against one untuned run that
spends the whole budget on itself.

For each seed, by RDP at ``--delta`` throughout (the accountant that composes
``RepeatAndSelectDpEvent``), with ``fedjax_dp.sweep``:

* ``untuned``: one run at the config's own clip and server learning rate, calibrated to
  ``--epsilon``;
* ``grid, accounted``: every grid point once, each run's noise z chosen so that the G runs composed
  spend ``--epsilon`` (a fixed grid has no selection bound: composition);
* ``random count, accounted``: a Poisson(G) number of runs at grid points drawn uniformly, z chosen
  so that ``RepeatAndSelectDpEvent`` spends ``--epsilon``;
* ``grid, unaccounted``: every grid point calibrated to ``--epsilon`` on its own, the best taken,
  what a paper that tunes and reports one run's epsilon does; the row gives the epsilon its
  selection really spends.

The selection metric is the central test set's accuracy (server-held data: no privacy cost, as the
sweep labels it). Raw rows (with provenance) go to ``<out>/sweep_rows.json`` after every setting.

    python experiments/accounted_sweep.py --seeds 0 1 2 --rounds 20
"""

from __future__ import annotations

import argparse
import json
import math
import os

import shared_data  # noqa: F401  (FEDJAX_DP_DATA: the shipped configs' data folder)
from scipy import optimize

import fedjax_dp
from fedjax_dp.privacy.accounting import selection
from fedjax_dp.privacy.sampling.poisson import PoissonSampling
from fedjax_dp.training.results import dumps as strict_json
from provenance import provenance


def grid(args) -> dict:
    return {"dp.clip_norm": args.clips, "server.learning_rate": args.server_lrs}


def noise_for(args, runs: str, count: int) -> float:
    """z whose released model spends ``--epsilon``: ``count`` runs composed ('fixed'), or the best
    of a Poisson(count) number ('poisson'), each of ``--rounds`` Poisson-sampled rounds."""
    sampler = PoissonSampling(args.clients, args.rate)
    if runs == "fixed":  # count runs of T rounds compose as one run of count * T rounds
        return sampler.calibrate(args.epsilon, args.delta, count * args.rounds, accountant="rdp")

    def gap(log_z):
        event = selection.run_event(
            [(sampler.round_event(math.exp(log_z), 1), args.rounds)], kind="rdp"
        )
        return selection.selection_cost(event, args.delta, runs, count).selected - args.epsilon

    return math.exp(optimize.brentq(gap, math.log(0.05), math.log(200.0), xtol=1e-6))


def base(args, seed: int, **overrides) -> dict:
    return {
        "rounds": args.rounds,
        "eval_every": args.rounds,
        "seed": seed,
        "data.num_clients": args.clients,
        "sampling.rate": args.rate,
        "privacy.accountant": "rdp",
        "privacy.delta": args.delta,
        **overrides,
    }


def released(summary) -> dict:
    best = summary.best or {}
    return {
        "best_accuracy": best.get("metric"),
        "best_settings": best.get("settings"),
        "runs": len(summary.runs),
        "run_epsilons": [r["epsilon"] for r in summary.runs],
        "run_accuracies": [r["metric"] for r in summary.runs],
        "selected_epsilon": summary.privacy.get("selected_epsilon"),
        "single_run_epsilon": summary.privacy.get("single_run_epsilon"),
        "composed_epsilon": summary.privacy.get("composed_epsilon"),
        "accounting": summary.privacy.get("accounting"),
        "draw": summary.draw,
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="dp_fedavg_mnist")
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--clips", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    parser.add_argument("--server-lrs", type=float, nargs="+", default=[0.5, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--rate", type=float, default=0.2)
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE (repeatable)")
    parser.add_argument("--out", default="results/accounted_sweep")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.set)
    for key, value in extra.items():
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            pass
    points = len(args.clips) * len(args.server_lrs)
    z_fixed, z_random = noise_for(args, "fixed", points), noise_for(args, "poisson", points)
    rows = []

    def record(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "sweep_rows.json"), "w") as f:
            f.write(
                strict_json({"setting": provenance(), "args": vars(args), "rows": rows}, indent=2)
            )

    def sweep(name, seed, runs, overrides):
        return fedjax_dp.sweep(
            args.config,
            grid(args),
            workdir=os.path.join(args.out, f"{name}-seed{seed}"),
            runs=runs,
            num_runs=points,
            seed=seed,
            overrides={**base(args, seed, **overrides), **extra},
            progress=False,
        )

    for seed in args.seeds:
        one = fedjax_dp.Experiment(
            args.config, {**base(args, seed, **{"privacy.target_epsilon": args.epsilon}), **extra}
        ).run(os.path.join(args.out, f"untuned-seed{seed}"), overwrite=True, progress=False)
        record(
            {
                "method": "untuned",
                "seed": seed,
                "accuracy": one.final["test_accuracy"],
                "released_epsilon": one.epsilon,
            }
        )
        for method, runs, overrides in (
            ("grid, accounted", "fixed", {"dp.noise_multiplier": z_fixed}),
            ("random count, accounted", "poisson", {"dp.noise_multiplier": z_random}),
            ("grid, unaccounted", "fixed", {"privacy.target_epsilon": args.epsilon}),
        ):
            overrides.setdefault("privacy.target_epsilon", 0.0)
            s = sweep(method.replace(", ", "_").replace(" ", "_"), seed, runs, overrides)
            record(
                {
                    "method": method,
                    "seed": seed,
                    "noise_multiplier": overrides.get("dp.noise_multiplier"),
                    **released(s),
                }
            )


if __name__ == "__main__":
    main()
