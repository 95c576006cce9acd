"""What a run's epsilon queries cost under PLD accounting, with and without ``cached_pld`` (issue
20).

A run asks for epsilon after round after round of the same Poisson-subsampled Gaussian.
dp_accounting's ``PLDAccountant`` builds the round's PLD from the mechanism at every query;
``CachedPldAccountant`` (``fedjax_dp.privacy.accounting.cached_pld``, what
``privacy.accounting.accountant`` uses) builds it once. Both are timed in this one process over the
same schedule, interleaved, and their epsilons compared (they must be equal). JSON out; the seconds
depend on the machine (say which), the ratio is the result.

    python benchmarks/pld_queries.py --out benchmarks/out/pld_queries.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))

from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent  # noqa: E402
from dp_accounting.pld import pld_privacy_accountant  # noqa: E402

from fedjax_dp.privacy.accounting import cached_pld  # noqa: E402


def queries(make, event, rounds, every, delta):
    """Seconds and epsilons of a run's queries: after every ``every``-th round, a fresh accountant
    of the whole history (what ``privacy.accounting.accountant.Accountant`` does at each query)."""
    start, epsilons = time.perf_counter(), []
    for t in range(every, rounds + 1, every):
        accountant = make()
        accountant.compose(event, t)
        epsilons.append(accountant.get_epsilon(delta))
    return time.perf_counter() - start, epsilons


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=0.01)
    parser.add_argument("--noise", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--discretization", type=float, default=1e-4)
    parser.add_argument("--out", default=os.path.join("benchmarks", "out", "pld_queries.json"))
    args = parser.parse_args()
    event = PoissonSampledDpEvent(args.rate, GaussianDpEvent(args.noise))
    makers = {
        "dp_accounting": lambda: pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=args.discretization
        ),
        "cached": lambda: cached_pld.CachedPldAccountant(
            value_discretization_interval=args.discretization
        ),
    }
    seconds, epsilons = {name: [] for name in makers}, {}
    # interleaved twice; the cache is cleared so each cached pass builds its PLD once
    for _ in range(2):
        for name, make in makers.items():
            cached_pld.subsampled_gaussian_pld.cache_clear()
            took, epsilons[name] = queries(make, event, args.rounds, args.every, 1e-5)
            seconds[name].append(took)
    result = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "args": vars(args),
        "queries": len(epsilons["cached"]),
        "seconds": seconds,
        "ratio_dp_accounting_over_cached": min(seconds["dp_accounting"]) / min(seconds["cached"]),
        "epsilons_equal": epsilons["cached"] == epsilons["dp_accounting"],
        "final_epsilon": epsilons["cached"][-1],
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
