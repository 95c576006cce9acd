"""A distributed-DP round of workload W against the central Gaussian round, side by side in one run
(distributed DP's cost: "a distributed round of workload W (MLP, 1,000 clients) within 1.5x the
central round's time on this CPU").

Both rounds are the library's ``FederatedRound`` of FedAvg on workload W's cohort (``--cohort``
clients of 60 examples, one epoch of 6 steps of B = 10, the 2NN MLP) through
``chain(FlatClip(1), noise, fixed_denominator)`` on the engine's ``chunked`` strategy (``--chunk``
clients vmapped at a time: the distributed pipeline holds several model-sized vectors per client, so
a vmap over all 1,000 needs over 12 GB); only the noise differs:

  central      ``GaussianNoise``: one draw of N(0, (z S)^2) on the summed model (the baseline)
  ddgauss      ``DistributedNoise`` with discrete Gaussian shares: each client rotates (Hadamard),
               scales, rounds conditionally, adds its share and reduces modulo 2^bits; the server
               decodes the modular sum
  skellam      the same with Skellam shares
  skellam_summed  Skellam with ``ddp.shares=summed``: the clients rotate, scale and round; the
               surviving shares' sum is drawn once by the server (the same law of the modular sum)

The variants are alternated round by round (``--repeats`` timed rounds each after one untimed
round that compiles), so a noisy machine slows them alike; each variant's median round and its
ratio to ``central`` are written (JSON), measured in this one run.

    python benchmarks/distributed_dp_round.py --cohort 1000 --out benchmarks/measured/ddp_round.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))
sys.path.insert(1, HERE)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from fedjax_dp.algorithms.fedavg import FedAvg  # noqa: E402
from fedjax_dp.core.round import FederatedRound  # noqa: E402
from fedjax_dp.core.uploads import chain, fixed_denominator  # noqa: E402
from fedjax_dp.data.packing import pack_cohort  # noqa: E402
from fedjax_dp.models import get_model  # noqa: E402
from fedjax_dp.privacy.distributed.plan import DistributedPlan  # noqa: E402
from fedjax_dp.privacy.distributed.transform import DistributedNoise  # noqa: E402
from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip  # noqa: E402
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise  # noqa: E402
from workload_w_data import BATCH, CLIP, EXAMPLES, LR, SIGMA, make_population  # noqa: E402

VARIANTS = ("central", "ddgauss", "skellam", "skellam_summed")


def rounds(cohort: int, bits: int, chunk: int):
    model = get_model("mlp_2nn", (28, 28, 1), 10)
    params = model.init(jax.random.key(0))
    template = jax.eval_shape(lambda p: p, params)
    dim = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))
    fedavg = FedAvg(model.per_example_loss, optax.sgd(LR))

    def noise(name):
        if name == "central":
            return GaussianNoise(((1, SIGMA),))
        mechanism, summed = name.removesuffix("_summed"), name.endswith("_summed")
        beta = math.exp(-0.5)
        plan = DistributedPlan(mechanism, bits, beta, 4.0, CLIP, SIGMA, dim, cohort, cohort)
        return DistributedNoise(plan, template, 0.0, summed)

    return params, {
        name: FederatedRound(
            fedavg,
            chain(FlatClip(CLIP), noise(name), fixed_denominator(float(cohort))),
            "chunked",
            chunk,
        )
        for name in VARIANTS
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cohort", type=int, default=1000)
    parser.add_argument("--bits", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--chunk", type=int, default=100, help="clients a chunk (the cohort engine's 'chunked')"
    )
    parser.add_argument("--out", default="benchmarks/measured/ddp_round.json")
    args = parser.parse_args()
    x, y = make_population()
    flat_x, flat_y = x.reshape(-1, 28, 28, 1), y.reshape(-1)
    clients = [np.arange(i * EXAMPLES, (i + 1) * EXAMPLES) for i in range(args.cohort)]
    cohort = pack_cohort(flat_x, flat_y, clients, BATCH, 1, np.random.default_rng(0))
    cohort["client_id"] = np.arange(args.cohort, dtype=np.int32)
    params, runners = rounds(args.cohort, args.bits, args.chunk)
    states = {name: runner.init(params) for name, runner in runners.items()}
    seconds = {name: [] for name in VARIANTS}
    for repeat in range(args.repeats + 1):  # the first round of each compiles: not timed
        for name in VARIANTS:
            start = time.perf_counter()
            result = runners[name](states[name], cohort, jax.random.key(repeat), repeat + 1)
            jax.block_until_ready(result.state.params)
            if repeat:
                seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    out = {
        "benchmark": "distributed_dp_round",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "cohort": args.cohort,
        "engine": f"chunked, {args.chunk} clients a chunk",
        "bits": args.bits,
        "repeats": args.repeats,
        "seconds": seconds,
        "median_seconds": median,
        "ratio_to_central": {name: median[name] / median["central"] for name in VARIANTS},
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: out[k] for k in ("median_seconds", "ratio_to_central")}, indent=1))


if __name__ == "__main__":
    main()
