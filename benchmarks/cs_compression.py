"""Compress + reconstruct cost (issue 7 benchmark): the block-sum operator of Alg. 3 vs a dense
Gaussian matrix for one layer of 1e3 to 1e7 entries (dense only while b x I fits, <= 2e8 entries),
a whole VGG16-size update (about 15M parameters, VGG16's CIFAR layer shapes) at Alg. 2 rates, and a
tiled random matrix regenerated at every product vs held in memory for the round (``materialized``).
Each case is one jitted program y = Phi x, x_hat = Rec(y) (minimum norm); median of 5 timed calls
after compilation; memory from XLA's analysis of the compiled program (arguments + outputs +
temporaries). Target: the 15M update in < 50 ms, memory O(parameters).

    python benchmarks/cs_compression.py --out benchmarks/out/compression.json

(Not ``compression.py``: run as a script, that name would shadow the ``compression`` package jax
imports.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xla_cost import compiled_cost, write_result  # noqa: E402

from fedjax_dp.compression.materialized import (
    MaterializedRandomMatrix,
    materialized_matrices,
)  # noqa: E402
from fedjax_dp.compression.operators import RandomMatrix, make_operator  # noqa: E402
from fedjax_dp.compression.pytree import LayerwiseCompressor  # noqa: E402
from fedjax_dp.compression.rates import dynamic_rates  # noqa: E402
from fedjax_dp.compression.reconstruction import min_norm  # noqa: E402

DENSE_LIMIT = 2e8  # entries of Phi


def timed(fn, *args) -> dict:
    cost = compiled_cost(fn, *args, repeats=5)
    return {"ms": 1e3 * cost.pop("seconds"), **cost}


def vgg16_update(key) -> dict:
    """Random update with VGG16's CIFAR-10 parameter shapes (13 conv 3x3 layers, 512-512-10
    head)."""
    channels = [3, 64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]
    shapes = {f"conv{i}": (3, 3, channels[i], channels[i + 1]) for i in range(13)}
    shapes.update(fc1=(512, 512), fc2=(512, 512), fc3=(512, 10))
    tree = {}
    for i, (name, shape) in enumerate(shapes.items()):
        tree[name] = {
            "kernel": jax.random.normal(jax.random.fold_in(key, i), shape) * 0.01,
            "bias": jnp.zeros(shape[-1]),
        }
    return tree


def regenerated_vs_materialized(size: int, rate: float) -> dict:
    """One compress + min-norm reconstruction of a layer with a tiled Gaussian matrix (4096 columns
    a tile, so the reconstruction runs conjugate gradients): every product regenerating Phi, against
    Phi generated once and held (its generation timed apart)."""
    op = RandomMatrix(size, rate)
    x = jax.random.normal(jax.random.key(size), (size,))
    start = time.perf_counter()
    (matrix,) = jax.block_until_ready(materialized_matrices([op], limit_bytes=float("inf")))
    generate_s = time.perf_counter() - start
    regenerated = timed(lambda v: min_norm(op, op.measure(v)), x)

    def held_round_trip(m, v):
        held_op = MaterializedRandomMatrix(op, m)
        return min_norm(held_op, held_op.measure(v))

    held = timed(held_round_trip, matrix, x)
    return {
        "size": size,
        "rate": rate,
        "measurements": op.shape[0],
        "generate_ms": 1e3 * generate_s,
        "regenerated": regenerated,
        "materialized": held,
        "speedup": regenerated["ms"] / held["ms"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6, 10**7])
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument(
        "--random", default="8192:0.25", help="SIZE:RATE of the regenerated vs materialized case"
    )
    parser.add_argument("--out", default=os.path.join("benchmarks", "out", "compression.json"))
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        x = jax.random.normal(jax.random.key(size), (size,))
        for kind in ("block", "gaussian"):
            op = make_operator(kind, size, args.rate, tile=max(size, 1))
            if kind == "gaussian" and op.shape[0] * size > DENSE_LIMIT:
                rows.append(
                    {
                        "size": size,
                        "operator": kind,
                        "skipped": f"dense Phi would hold {op.shape[0] * size:.1e} entries",
                    }
                )
                continue
            row = {
                "size": size,
                "operator": kind,
                "measurements": op.shape[0],
                **timed(lambda v, op=op: min_norm(op, op.measure(v)), x),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    update = vgg16_update(jax.random.key(0))
    params = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(update))
    comp = LayerwiseCompressor(update, dynamic_rates(update))
    whole = {
        "parameters": params,
        "measurements": comp.num_measurements,
        "operator": "block",
        **timed(lambda u: comp.reconstruct(comp.compress(u)), update),
    }
    whole["memory_in_update_sizes"] = whole["memory_bytes"] / (4 * params)
    print(json.dumps(whole), flush=True)
    size, rate = args.random.split(":")
    random = regenerated_vs_materialized(int(size), float(rate))
    print(json.dumps(random), flush=True)
    write_result(
        args.out,
        {"rate": args.rate, "layers": rows, "vgg16_update": whole, "random_matrix": random},
    )


if __name__ == "__main__":
    main()
