"""The noise each correlated-noise strategy puts on the model, per unit of z S, for a run's length
and participation, with no training:

* the prefix sums' (what the model integrates): sens(C) x RMS_t ||(A C^{-1})[t]|| and the largest
  term (``NoisePlan.error``, the numbers ``privacy.json`` reports);
* each round's own update's, the step from prefix sum t - 1 to t: sens(C) x RMS_t ||(C^{-1})[t]||
  (for the identity, sens(C) itself).

At equal epsilon every strategy of one participation scheme has the same z, so these are the noise
the model receives; comparing them across strategies is how the papers' figures are read (e.g.
DP-FTRL's efficient tree against the plain tree on StackOverflow, single participation over 1,600
rounds).

    python experiments/strategy_errors.py --rounds 1600 --participation single --out
    strategy_errors.json python experiments/strategy_errors.py --rounds 100 --participation
    min_separation --separation 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedjax_dp.privacy.correlated import strategies
from fedjax_dp.privacy.correlated.participation import Participation
from fedjax_dp.privacy.correlated.plan import NoisePlan
from fedjax_dp.training.results import dumps as strict_json
from provenance import provenance


def errors(name: str, rounds: int, participation: Participation) -> dict:
    start = time.perf_counter()
    plan = NoisePlan(strategies.build(name, rounds, participation), participation, 1.0)
    prefix = np.tril(np.ones((rounds, rounds))) if name == "identity" else plan.strategy.decoder()
    # row t: what round t's own update carries, per unit draw
    steps = np.diff(prefix, axis=0, prepend=0.0)
    per_round = plan.sensitivity * float(np.sqrt(np.mean((steps**2).sum(axis=1))))
    return {
        "strategy": name,
        "sensitivity": plan.sensitivity,
        **plan.error(),
        "per_round_rmse_over_z_clip": per_round,
        "seconds": round(time.perf_counter() - start, 2),
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument(
        "--participation", choices=("single", "min_separation", "cyclic"), default="single"
    )
    parser.add_argument(
        "--separation", type=int, default=1, help="b, for min_separation and cyclic"
    )
    parser.add_argument("--strategies", nargs="+", default=[s for s in strategies.STRATEGIES])
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    participation = Participation(
        args.participation, args.separation if args.participation != "single" else 1
    )
    too_long = [
        s for s in args.strategies if s == "dense" and args.rounds > strategies.MAX_DENSE_ROUNDS
    ]
    rows = [errors(s, args.rounds, participation) for s in args.strategies if s not in too_long]
    print(
        f"{args.rounds} rounds, {participation.describe()}"
        + (f" (dense skipped: at most {strategies.MAX_DENSE_ROUNDS} rounds)" if too_long else "")
    )
    print(
        "| strategy | sens(C) | prefix RMSE / (z S) | prefix max / (z S) | per-round RMSE / (z S)"
        " |\n| --- | --- | --- | --- | --- |"
    )
    for r in rows:
        print(
            f"| {r['strategy']} | {r['sensitivity']:.3f} | {r['prefix_sum_rmse_over_z_clip']:.2f} |"
            f" {r['prefix_sum_max_error_over_z_clip']:.2f} |"
            f" {r['per_round_rmse_over_z_clip']:.2f} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            f.write(
                strict_json({"setting": provenance(), "args": vars(args), "rows": rows}, indent=2)
            )


if __name__ == "__main__":
    main()
