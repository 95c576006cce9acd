"""What canaries cost a round: workload W's central DP-FedAvg round with and without the in-run
audit, side by side in one run (the in-run audit's cost: "1,000 canaries add at most 5 % to a round
of workload W (MLP, 1,000 clients)").

Every variant is the library's ``FederatedRound`` of FedAvg on workload W's cohort (``--cohort``
clients of 60 examples, one epoch of 6 steps of B = 10, the 2NN MLP) through
``chain(FlatClip(1), GaussianNoise, fixed_denominator)`` on the engine's ``chunked`` strategy:

  plain        the round without canaries (the baseline)
  canaries     the same round with ``audit.canaries=--canaries`` (2k canaries on fair coins and k
               reference ones), their updates sent through the same chain, and the round's released
               aggregate appended to the audit's file (the all-iterates threat model); isotropic
               directions (``audit.directions=gaussian``, the default). With
               ``--participation every_round`` every inserted canary (about k) takes part in every
               round, the most a round can carry; with ``sampled`` a canary takes part when its
               shadow client, drawn from a population of ``--population``, is in the cohort (the
               cohort is clients 0..cohort-1, so about k cohort / population a round)
  canaries_rademacher  the same with ``audit.directions=rademacher`` (signs from a counter hash)
  side_by_side ``audit.side_by_side``: the run's own round without canaries plus the canary model's
               round (what keeping the run's metrics free of canaries costs)

The variants are alternated round by round (``--repeats`` timed rounds each after one untimed
round that compiles), so a noisy machine slows them alike; each variant's median round and its
ratio to ``plain`` are written (JSON), measured in this one run. The scoring at the end of the run
(once, not per round) is timed separately.

    python benchmarks/in_run_audit_round.py --out benchmarks/measured/in_run_audit_round.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))
sys.path.insert(1, HERE)

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from fedjax_dp.algorithms.fedavg import FedAvg  # noqa: E402
from fedjax_dp.core.round import FederatedRound  # noqa: E402
from fedjax_dp.core.uploads import chain, fixed_denominator  # noqa: E402
from fedjax_dp.data.packing import pack_cohort  # noqa: E402
from fedjax_dp.models import get_model  # noqa: E402
from fedjax_dp.privacy.audit.in_run import CanaryAudit  # noqa: E402
from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip  # noqa: E402
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise  # noqa: E402
from workload_w_data import BATCH, CLIP, EXAMPLES, LR, POPULATION, SIGMA, make_population  # noqa: E402

VARIANTS = ("plain", "canaries", "canaries_rademacher", "side_by_side")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cohort", type=int, default=1000)
    parser.add_argument("--canaries", type=int, default=1000, help="audit.canaries (k)")
    parser.add_argument(
        "--participation", default="every_round", choices=("every_round", "sampled")
    )
    parser.add_argument(
        "--population", type=int, default=POPULATION, help="clients canaries shadow"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=100, help="clients a chunk ('chunked')")
    parser.add_argument("--out", default="benchmarks/measured/in_run_audit_round.json")
    args = parser.parse_args()
    x, y = make_population()
    flat_x, flat_y = x.reshape(-1, 28, 28, 1), y.reshape(-1)
    clients = [np.arange(i * EXAMPLES, (i + 1) * EXAMPLES) for i in range(args.cohort)]
    cohort = pack_cohort(flat_x, flat_y, clients, BATCH, 1, np.random.default_rng(0))
    ids = np.arange(args.cohort, dtype=np.int32)
    cohort["client_id"] = ids
    model = get_model("mlp_2nn", (28, 28, 1), 10)
    params = model.init(jax.random.key(0))
    fedavg = FedAvg(model.per_example_loss, optax.sgd(LR))
    runner = FederatedRound(
        fedavg,
        chain(FlatClip(CLIP), GaussianNoise(((1, SIGMA),)), fixed_denominator(float(args.cohort))),
        "chunked",
        args.chunk,
    )

    def make_audit(directions):
        section = ml_collections.ConfigDict(
            dict(
                canaries=args.canaries,
                participation=args.participation,
                scale=1.0,
                confidence=0.95,
                all_iterates=True,
                side_by_side=False,
                directions=directions,
            )
        )
        directory = tempfile.mkdtemp(prefix="in_run_audit_")
        template = fedavg.upload_template(params)
        return CanaryAudit(section, 0, args.population, params, template, CLIP, 1e-5, directory)

    audits = {"canaries": make_audit("gaussian"), "canaries_rademacher": make_audit("rademacher")}
    audit, beside = audits["canaries"], make_audit("gaussian")
    states = {name: runner.init(params) for name in VARIANTS}
    states["canary_model"] = runner.init(params)

    def one(name, t):
        key = jax.random.key(t)
        if name == "plain":
            results = {name: runner(states[name], cohort, key, t)}
        elif name in audits:
            canaries = audits[name].cohort(t, ids)
            results = {name: runner(states[name], cohort, key, t, canaries=canaries)}
            audits[name].observe(results[name].released)
        else:
            results = {
                name: runner(states[name], cohort, key, t),
                "canary_model": runner(
                    states["canary_model"], cohort, key, t, canaries=beside.cohort(t, ids)
                ),
            }
            beside.observe(results["canary_model"].released)
        states.update({k: r.state for k, r in results.items()})
        return list(results.values())

    seconds = {name: [] for name in VARIANTS}
    for repeat in range(args.repeats + 1):  # the first round of each compiles: not timed
        for name in VARIANTS:
            start = time.perf_counter()
            results = one(name, repeat + 1)
            jax.block_until_ready([r.state.params for r in results])
            if repeat:
                seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    # the scoring's time does not depend on the formal epsilon it compares with (no tracker here)
    scoring = {}
    for name, each in audits.items():
        each.formal_epsilon = lambda tracker: 1.0
        start = time.perf_counter()
        record = each.report(states[name].params, None)
        scoring[name] = time.perf_counter() - start
    out = {
        "benchmark": "in_run_audit_round",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "cohort": args.cohort,
        "engine": f"chunked, {args.chunk} clients a chunk",
        "audit_canaries": args.canaries,
        "participation": args.participation,
        "population": args.population,
        "canaries_inserted": int(audit.inserted.sum()),
        "canaries_per_round": audit.joined,
        "repeats": args.repeats,
        "seconds": seconds,
        "median_seconds": median,
        "ratio_to_plain": {name: median[name] / median["plain"] for name in VARIANTS},
        "scoring_seconds_once_per_run": scoring,
        "scored_rounds": len(audit.joined),
        "scored_canaries": record["canaries"],
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: out[k] for k in ("median_seconds", "ratio_to_plain")}, indent=1))


if __name__ == "__main__":
    main()
