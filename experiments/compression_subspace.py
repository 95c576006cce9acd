"""How far a compressed run's global model moved outside the row space of its layers' measurement
matrices.

With Alg. 3's block matrix at a fixed rate r and ``compression.refresh='fixed'``, min-norm
reconstruction returns each upload's projection onto the matrix's row space, so w_T - w_0 of that
layer is constant within every block (z = floor(1 / r) neighbouring weights) for the whole run. This
reads a run folder (its ``config.json``, ``metrics.jsonl`` and newest checkpoint), rebuilds w_0 from
the run's seed and prints, per block-compressed layer whose rate never changed, the largest
within-block spread (max - min) of w_T - w_0 beside the largest movement (a spread at float
rounding, ~1e-7, against a movement of ~1 says: confined).

    python experiments/compression_subspace.py results/seed004_t7s1_cifar10_acid3_block/acid3-block
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from ml_collections import ConfigDict

from fedjax_dp.compression.operators import BlockSum
from fedjax_dp.core import rng as rng_lib
from fedjax_dp.data.builders import build_dataset
from fedjax_dp.models import get_model


def layer_spreads(workdir: str) -> list[dict]:
    """Per layer: name, size, the rates it had, and (one block rate only) the within-block spread
    and the largest entry of w_T - w_0."""
    cfg = json.load(open(os.path.join(workdir, "config.json")))
    checkpoint = sorted(glob.glob(os.path.join(workdir, "checkpoints", "round_*")))[-1]
    final = ocp.StandardCheckpointer().restore(os.path.join(os.path.abspath(checkpoint), "state"))[
        "state"
    ]["params"]
    dataset = build_dataset(ConfigDict(cfg["data"]), cfg["seed"])
    model = get_model(cfg["model"]["name"], dataset.example_shape, dataset.num_classes)
    initial = model.init(rng_lib.run_streams(cfg["seed"], False).model_init)
    rates = [
        json.loads(line).get("compression_rates")
        for line in open(os.path.join(workdir, "metrics.jsonl"))
    ]
    rates = [r for r in rates if r]
    rows = []
    leaves = jax.tree_util.tree_flatten_with_path(initial)[0]
    for i, ((path, w0), wt) in enumerate(zip(leaves, jax.tree_util.tree_leaves(final))):
        moved = (np.asarray(wt, np.float64) - np.asarray(w0, np.float64)).ravel()
        seen = sorted({r[i] for r in rates})
        row = {
            "layer": jax.tree_util.keystr(path),
            "size": moved.size,
            "rates": seen,
            "max_movement": float(np.abs(moved).max()),
        }
        if len(seen) == 1 and cfg["compression"]["kind"] == "block":
            bounds = np.cumsum(BlockSum(moved.size, seen[0]).block_sizes)[:-1]
            row["within_block_spread"] = max(
                float(np.ptp(block)) for block in np.split(moved, bounds)
            )
        rows.append(row)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "workdir", help="a finished run's folder (config.json, metrics.jsonl, checkpoints/)"
    )
    args = p.parse_args(argv)
    for row in layer_spreads(args.workdir):
        spread = row.get("within_block_spread")
        print(
            f"{row['layer']:28s} {row['size']:7d} rates {row['rates']}  max |w_T - w_0|"
            f" {row['max_movement']:.3g}"
            + (f"  within-block spread {spread:.3g}" if spread is not None else "")
        )


if __name__ == "__main__":
    main()
