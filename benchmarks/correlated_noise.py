"""What correlated noise costs per round, against independent noise, in one process (issue 75,
"Performance").

For a model of ``--params`` parameters (one float32 vector, 1M by default) and a run of ``--rounds``
rounds, the server's noise step of each strategy
(``privacy.mechanisms.upload_correlated_noise.CorrelatedNoise.server``: the iid draw and the
stream's ``multiply_next``), jitted, timed at early, middle and late rounds (the stream's state
advanced there first), with the state's bytes:

  identity   DP-FedAvg's independent noise (the baseline)
  banded     a ``--bands``-banded Toeplitz strategy: O(bands x params) state
  blt        a buffered-linear-Toeplitz strategy of ``--buffers`` buffers (decays spread in (0.5,
             0.99); the cost of its stream does not depend on how it was optimised): O(buffers x
             params) state
  tree       binary-tree aggregation: O(log2(rounds) x params) state

A flat cost across the round index is the claim checked (BLT and banded independent of t); the ratio
to identity is the overhead. The seconds depend on the machine (JSON records which).

    python benchmarks/correlated_noise.py --out benchmarks/out/correlated_noise.json
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))
sys.path.insert(1, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax_privacy.matrix_factorization import buffered_toeplitz, toeplitz  # noqa: E402

from fedjax_dp.core.uploads import ServerContext  # noqa: E402
from fedjax_dp.privacy.correlated import strategies, tree_aggregation  # noqa: E402
from fedjax_dp.privacy.correlated.participation import Participation  # noqa: E402
from fedjax_dp.privacy.correlated.plan import NoisePlan  # noqa: E402
from fedjax_dp.privacy.mechanisms.upload_correlated_noise import CorrelatedNoise  # noqa: E402
from timing import best_ms  # noqa: E402
from xla_cost import write_result  # noqa: E402


def strategy(name: str, args) -> strategies.Strategy:
    n = args.rounds
    if name == "identity":
        return strategies.identity(n)
    if name == "tree":
        return strategies.Strategy(
            "tree", n, tree_aggregation.noising_matrix(n), tree_aggregation.levels(n)
        )
    if name == "banded":  # the streaming cost does not depend on the coefficients' values
        coef = np.asarray(toeplitz.optimal_max_error_strategy_coefs(args.bands), np.float64)
        coef /= np.linalg.norm(coef)
        noising = toeplitz.inverse_as_streaming_matrix(
            jnp.asarray(coef, jnp.float32), column_normalize_for_n=n
        )
        return strategies.Strategy(
            "banded",
            n,
            noising,
            args.bands - 1,
            bands=args.bands,
            toeplitz_coef=coef,
            column_normalized=True,
        )
    decay = np.linspace(0.5, 0.99, args.buffers)
    blt = buffered_toeplitz.BufferedToeplitz.build(
        decay.astype(np.float32),
        (0.3 / args.buffers * np.ones(args.buffers)).astype(np.float32),
        dtype=jnp.float32,
    )
    return strategies.Strategy(
        "blt", n, blt.as_streaming_matrix(), args.buffers, toeplitz_coef=np.ones(1)
    )


def measure(name: str, args) -> dict:
    plan = NoisePlan(strategy(name, args), Participation("single"), 1.0)
    transform = CorrelatedNoise(plan)
    total = jnp.zeros(args.params, jnp.float32)

    @jax.jit
    def step(state, key):
        ctx = ServerContext(
            state,
            {"std_over_clip": jnp.float32(1.0)},
            jnp.float32(1.0),
            key,
            {},
            {},
            None,
            None,
            key,
        )
        noised, state, _ = transform.server(total, ctx)
        return noised, state

    state = transform.init(total)
    state_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(state))
    key = jax.random.key(0)
    out, t = {}, 0
    for at in sorted({1, args.rounds // 2, args.rounds}):
        while t < at - 1:  # advance the stream to round `at`
            _, state = step(state, jax.random.fold_in(key, t))
            t += 1
        out[f"round_{at}_ms"] = best_ms(
            lambda s: step(s, key)[0], state, calls=args.calls, repeats=3
        )
    return {"state_bytes": state_bytes, "state_model_copies": state_bytes / total.nbytes, **out}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--params", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--bands", type=int, default=16)
    parser.add_argument("--buffers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/out/correlated_noise.json")
    args = parser.parse_args()
    results = {name: measure(name, args) for name in ("identity", "banded", "blt", "tree")}
    base = results["identity"][f"round_{args.rounds}_ms"]
    for name, r in results.items():
        r["ratio_to_identity_at_last_round"] = r[f"round_{args.rounds}_ms"] / base
        print(
            name, {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}, flush=True
        )
    write_result(args.out, {"args": vars(args), "results": results})


if __name__ == "__main__":
    main()
