"""A whole round of workload W with correlated noise against DP-FedAvg's independent noise (issue
75, "Performance": the round's time with matrix-factorization noise within 10 % of DP-FedAvg's).

Every variant runs the same round: workload W's cohort (``workload_w.WorkloadW``: local training,
clipping, the clipped sum over the cohort engine) and then the server's noise step on the model's
pytree, followed by the server update. Only the noise step differs:

  dp_fedavg  the library's ``GaussianNoise`` (DP-FedAvg's central noise: the baseline)
  identity   ``CorrelatedNoise`` with the identity strategy (the same draws, through the stream)
  banded     ``--bands``-banded Toeplitz strategy (O(bands x params) state)
  blt        ``--buffers``-buffer BLT (O(buffers x params) state)
  tree       binary-tree aggregation (O(log2(rounds) x params) state)

The strategies are built for ``--rounds`` rounds (the stream's cost does not depend on how far it
has gone: ``benchmarks/correlated_noise.py`` measures that). The variants are alternated round by
round (``--repeats`` rounds each after ``--warmup`` untimed ones), so a noisy machine slows them
alike; each variant's median round and its ratio to ``dp_fedavg`` are written, measured in this one
run.

    python benchmarks/correlated_noise_round.py --model mlp --cohort 1000 --out
    benchmarks/out/cn_round_mlp.json python benchmarks/correlated_noise_round.py --model cnn
    --cohort 100 --strategy loop --unroll full \
        --out benchmarks/out/cn_round_cnn.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))
sys.path.insert(1, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from correlated_noise import strategy  # noqa: E402
from fedjax_dp.core.uploads import ServerContext  # noqa: E402
from fedjax_dp.privacy.correlated.participation import Participation  # noqa: E402
from fedjax_dp.privacy.correlated.plan import NoisePlan  # noqa: E402
from fedjax_dp.privacy.mechanisms.upload_correlated_noise import CorrelatedNoise  # noqa: E402
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise  # noqa: E402
from workload_w import WorkloadW  # noqa: E402
from workload_w_data import CLIP, SIGMA  # noqa: E402
from xla_cost import write_result  # noqa: E402

VARIANTS = ("dp_fedavg", "identity", "banded", "blt", "tree")


def noise_transform(name: str, args):
    """The upload transform of one variant and the inputs its server side reads."""
    if name == "dp_fedavg":
        return GaussianNoise(schedule=((1, SIGMA),)), {
            "z": jnp.float32(SIGMA),
            "z_update": jnp.float32(SIGMA),
        }
    plan = NoisePlan(strategy(name, args), Participation("single"), SIGMA)
    return CorrelatedNoise(plan), {"std_over_clip": jnp.float32(plan.std_over_clip)}


class NoisyServer:
    """Workload W's server step with the library's noise transform: noise the clipped sum, divide by
    the cohort, apply; the transform's state (the stream's buffers) carried from round to round."""

    def __init__(self, name: str, args, params):
        transform, inputs = noise_transform(name, args)
        self.state = transform.init(params)
        self.state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(self.state))

        @jax.jit
        def server(params, clipped_sum, key, cohort, state):
            ctx = ServerContext(state, inputs, jnp.float32(CLIP), key, {}, {}, None, None, key)
            noised, state, _ = transform.server(clipped_sum, ctx)
            return jax.tree_util.tree_map(lambda p, s: p + s / cohort, params, noised), state

        self.server = server

    def __call__(self, params, clipped_sum, key, cohort):
        params, self.state = self.server(params, clipped_sum, key, cohort, self.state)
        return params


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    parser.add_argument("--cohort", type=int, default=1000)
    parser.add_argument("--strategy", default="sequential", help="the cohort engine's formulation")
    parser.add_argument(
        "--unroll", default="1", help="local steps' scan unroll: an integer, or 'full'"
    )
    parser.add_argument(
        "--conv-impl",
        default="xla",
        help=(
            "convolutions (auto's CPU choice for workload W's CNN: "
            "--strategy loop --unroll full --conv-impl xla)"
        ),
    )
    parser.add_argument(
        "--rounds", type=int, default=2000, help="the run length the strategies are built for"
    )
    parser.add_argument("--bands", type=int, default=16)
    parser.add_argument("--buffers", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", default="benchmarks/out/correlated_noise_round.json")
    args = parser.parse_args()

    unroll = True if args.unroll == "full" else int(args.unroll)
    work = WorkloadW(
        args.model,
        args.strategy,
        None,
        unroll,
        args.conv_impl,
        population=args.cohort,
        devices=jax.device_count(),
    )
    params_count = sum(x.size for x in jax.tree_util.tree_leaves(work.params))
    servers = {name: NoisyServer(name, args, work.params) for name in args.variants}
    times = {name: [] for name in args.variants}
    for r in range(args.warmup + args.repeats):
        # alternated: each round of the comparison runs every variant once
        for name in args.variants:
            work.server = servers[name]
            start = time.perf_counter()
            work.round(r, args.cohort)
            if r >= args.warmup:
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["dp_fedavg"]) if "dp_fedavg" in times else None
    results = {}
    for name in args.variants:
        median = statistics.median(times[name])
        results[name] = {
            "round_s_median": median,
            "round_s": times[name],
            "state_model_copies": servers[name].state_bytes / (4 * params_count),
            "ratio_to_dp_fedavg": median / base if base else None,
        }
        print(
            name,
            {
                k: round(v, 4) if isinstance(v, float) else v
                for k, v in results[name].items()
                if k != "round_s"
            },
            flush=True,
        )
    write_result(
        args.out,
        {
            "args": vars(args),
            "params": params_count,
            "devices": jax.device_count(),
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
