"""What calibrating z to a target epsilon costs under PLD accounting: the bracket from the RDP
answer's neighbourhood (``privacy.accounting.calibration.pld_bracket``, what
``calibrate_noise_multiplier`` does) against the wide bracket [0.25 z_rdp, 1.001 z_rdp] used before,
whose lower end builds the PLD of a low-noise mechanism (slow).

Both run dp_accounting's ``calibrate_dp_mechanism`` (Brent's method) in this one process,
interleaved, from cleared PLD caches, with the RDP answer already computed (the same for both); JSON
out. The seconds depend on the machine (say which), the ratio is the result; both z must meet the
target and agree to the tolerance (1e-4).

    python benchmarks/pld_calibration.py --out benchmarks/out/pld_calibration.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import dp_accounting  # noqa: E402

from fedjax_dp.privacy.accounting import accountant as accounting, cached_pld, calibration  # noqa: E402

CASES = {
    "shipped dp_fedavg_mnist (Poisson q = 0.2, 40 rounds, epsilon 8)": (
        8.0,
        1e-5,
        40,
        "poisson",
        0.2,
        0,
        0,
    ),
    "fixed-size 100 of 500, 40 rounds, epsilon 8": (8.0, 1e-5, 40, "fixed", 1.0, 500, 100),
    "Poisson q = 0.2, 2 rounds, epsilon 2 (the notebook's tiny run)": (
        2.0,
        1e-5,
        2,
        "poisson",
        0.2,
        0,
        0,
    ),
}


def wide_bracket(epsilon, delta, rounds, sampling, rate, population, cohort):
    """The calibration as it was: Brent over [0.25, 1.001] x the RDP answer for the run's own
    event."""
    make_event = lambda z: accounting.RoundEvent(sampling, z, rate, population, cohort)  # noqa: E731
    z_rdp = calibration.calibrate_noise_multiplier(
        epsilon, delta, rounds, sampling, rate, population, cohort, "rdp"
    )
    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: accounting.make_accountant("pld", make_event(1.0).neighboring_relation),
            lambda z: dp_accounting.SelfComposedDpEvent(make_event(z).dp_event("pld"), rounds),
            epsilon,
            delta,
            dp_accounting.ExplicitBracketInterval(0.25 * z_rdp, z_rdp * 1.001),
            tol=1e-4,
        )
    )


def library(epsilon, delta, rounds, sampling, rate, population, cohort):
    return calibration.calibrate_noise_multiplier(
        epsilon, delta, rounds, sampling, rate, population, cohort, "pld"
    )


def timed(method, case):
    """Seconds and z of one calibration from cold PLD caches (RDP answers kept: both methods share
    them)."""
    calibration.clear_cache()
    epsilon, delta, rounds, sampling, rate, population, cohort = case
    calibration.calibrate_noise_multiplier(
        epsilon, delta, rounds, sampling, rate, population, cohort, "rdp"
    )
    # the library brackets fixed-size sampling with the Poisson event's RDP answer
    if sampling == "fixed":
        calibration.calibrate_noise_multiplier(
            epsilon, delta, rounds, "poisson", cohort / population, kind="rdp"
        )
    cached_pld.subsampled_gaussian_pld.cache_clear()
    accounting._composed_pld.cache_clear()
    start = time.perf_counter()
    z = method(*case)
    return time.perf_counter() - start, z


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=os.path.join("benchmarks", "out", "pld_calibration.json"))
    args = parser.parse_args()
    rows = []
    for name, case in CASES.items():
        seconds, zs = {"wide_bracket": [], "library": []}, {}
        for _ in range(args.repeats):  # interleaved
            for method in (wide_bracket, library):
                took, zs[method.__name__] = timed(method, case)
                seconds[method.__name__].append(took)
        epsilons = {
            k: accounting.epsilon_of(
                [(accounting.RoundEvent(case[3], z, *case[4:]), case[2])], case[1], "pld"
            )
            for k, z in zs.items()
        }
        rows.append(
            {
                "case": name,
                "seconds": seconds,
                "z": zs,
                "epsilon_at_z": epsilons,
                "ratio_wide_over_library": min(seconds["wide_bracket"]) / min(seconds["library"]),
                "both_meet_the_target": all(e <= case[0] for e in epsilons.values()),
                "z_agree_to_tolerance": abs(zs["wide_bracket"] - zs["library"]) <= 2e-4,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    from xla_cost import write_result

    write_result(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
