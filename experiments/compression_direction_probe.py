"""Which part of a compressed first step switches a representation off: the round-1 updates of a run
reconstructed by each measurement operator, and where the server's first step would take the model.

The question left by ``representation_probe.py --round-one`` (experiments/RESULTS.md, seed 004, "Why
CIFAR-100 collapses"): along the compressed first move w_0 + k (w_1 - w_0) every layer of the CNN
dies, along the uncompressed one the features recover. Alg. 3's block rows sum disjoint blocks, so
their sum is the all-ones vector: the min-norm reconstruction keeps each layer's constant part (the
mean of its entries) whole, whatever the blocks or their permutation, and about a fraction r of the
rest, where a random (Gaussian, Bernoulli) matrix's reconstruction, the orthogonal projection onto a
random subspace, keeps about r of every direction alike. The probe separates the two (measured
answer, RESULTS "The block matrix keeps each layer's mean shift whole": the constant part kills).

From a run folder holding the round-1 checkpoint with the clients' g_n (any PFLDyn(Proto) / CUAG-PFL
run; every round-1 client starts at w_0 with g_n = 0, so its update is Delta_n = -g_n / alpha, seed
004 Eq. 12), for each direction below it forms the first server step s = (1 + s_N) mean_n
Rec(Delta_n) (PFLDyn's first step: twice the mean with the seed's cohort mean, as
``representation_probe`` derives it; 1 + |Q_1| / N times it with the population mean,
``first_step_factor``) and reads the model at w_0 + k s for k in ``LINE_MULTIPLES``:

* ``block`` / ``gaussian`` / ``bernoulli``: the updates measured and reconstructed (min-norm) by
  that operator at Alg. 2's rates from w_0 (the run's own rates and seed; the min-norm Rec is linear
  and round 1 has one matrix, so mean Rec(Delta_n) = Rec(mean Delta_n), one reconstruction);
  ``block`` should reproduce the checkpoint's w_1 - w_0 when the run used it
  (``block_vs_checkpoint``, relative distance);
* ``block_refreshed``: the block matrix with round 1's permutation of
  ``compression.refresh='round'``; ``block_signed``: with ``compression.signs='random'``'s +-1 per
  entry (``compression/signs.py``);
* ``uncompressed``: Rec = identity; ``shrunk``: each layer's uncompressed step times its rate (what
  a random projection keeps on average); ``leaf_means`` / ``without_leaf_means``: the uncompressed
  step's constant part of each leaf and the rest; ``block_residual``: what the block reconstruction
  drops, (1 + s_N) mean (Delta_n - Rec(Delta_n)).

Per direction and layer it also reports the share of the step's squared norm that is the mean over
the layer's units (``unit_common_share``, 1 when every unit moves alike) and that is each leaf's
mean entry (``leaf_mean_share``). Only the round-1 updates the server kept enter the mean
(``kept``).

    python experiments/compression_direction_probe.py results/c100_collapse_probe/compressed \\
        --out results/c100_collapse_probe/directions_all.json
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import numpy as np

from fedjax_dp.compression.materialized import materialized_matrices
from fedjax_dp.compression.operators import KINDS
from fedjax_dp.compression.pytree import LayerwiseCompressor
from fedjax_dp.compression.rates import dynamic_rates, fixed_rates
from fedjax_dp.compression.refresh import round_permutations
from fedjax_dp.compression.signs import layer_signs
from fedjax_dp.core import tree
from fedjax_dp.training.results import write_json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from provenance import stamped  # noqa: E402
from representation_probe import (
    LINE_MULTIPLES,
    layer_readings,
    mean_of,
    round_one_checkpoint,  # noqa: E402
    run_context,
)

# cnn_pfl's 64k-weight dense layer at r = 0.5: an 8 GB Gaussian matrix
MATERIALIZE_BYTES = 12 * 2**30


def round_one_updates(workdir: str, alpha: float) -> tuple[list, dict]:
    """Every kept round-1 client's update Delta_n = -g_n / alpha, and the checkpoint's parameters
    w_1."""
    _, updates, w1 = round_one_checkpoint(workdir, alpha)
    return [d for d in updates if kept(d)], w1


def kept(update) -> bool:
    """Whether the server averaged this round-1 update: finite (the server drops the others) and not
    all zero (a dropped client keeps g_n = 0)."""
    leaves = [np.asarray(v) for v in jax.tree_util.tree_leaves(update)]
    return all(np.isfinite(v).all() for v in leaves) and any(np.any(v != 0) for v in leaves)


def scaled(a, factor):
    return jax.tree_util.tree_map(lambda x, f=factor: f * np.asarray(x), a)


def _shares(step, part) -> dict:
    """Per layer: the share of ||step||^2 in ``part`` of its leaves (``part(v)`` returns that part's
    squared norm)."""
    shares = {}
    for name, layer in step.items():
        total = sum(float(np.sum(np.square(v))) for v in layer.values())
        shares[name] = sum(part(v) for v in layer.values()) / total if total > 0 else 0.0
    return shares


def unit_common_share(step) -> dict:
    """Per layer: the share of ||step||^2 that is the same for every unit (the mean over the last
    axis)."""
    return _shares(step, lambda v: float(np.sum(np.square(np.mean(v, axis=-1)))) * v.shape[-1])


def leaf_mean_share(step) -> dict:
    """Per layer: the share of ||step||^2 in each leaf's mean over all its entries (its constant
    part)."""
    return _shares(step, lambda v: float(np.mean(v)) ** 2 * v.size)


def leaf_means(step):
    """Each leaf's mean over its entries, broadcast: the part a block matrix always keeps whole (the
    all-ones vector is the sum of its rows, so it lies in the row space, whatever the blocks or
    their permutation)."""
    return jax.tree_util.tree_map(lambda v: np.full_like(v, np.mean(v)), step)


def reconstructed(compressor, step, permutations=None, signs=None):
    matrices = materialized_matrices(compressor.operators, MATERIALIZE_BYTES)
    rebuilt = jax.jit(
        lambda d, m, p, s: compressor.reconstruct(compressor.compress(d, m, p, s), m, p, s)
    )(step, matrices, permutations, signs)
    return jax.tree_util.tree_map(np.asarray, rebuilt)


def first_step_factor(cfg: dict, kept: int) -> float:
    """w_1 - w_0 = (1 + s) mean Rec(Delta_n) (``algorithms/pfldyn_proto.py``: g^1 = -alpha s Delta
    w, w^1 = w^0 + Delta w - g^1 / alpha), s = 1 for the seed's cohort mean, |Q_1| / N for the
    population mean."""
    population = cfg.get("pfldyn", {}).get("server_mean", "cohort") == "population"
    return 1.0 + (kept / cfg["data"]["num_clients"] if population else 1.0)


def directions(cfg: dict, initial, updates: list, kinds=KINDS) -> tuple[dict, dict]:
    """The first server step (1 + s) mean Rec(Delta_n) for each reconstruction (see the module
    docstring), and Alg. 2's rates from w_0."""
    compression = cfg["compression"]
    reference = jax.tree_util.tree_map(np.asarray, initial)
    rates = (
        dynamic_rates(reference, compression["r_min"], compression["r_max"])
        if compression["rates"] == "dynamic"
        else fixed_rates(reference, float(compression["rates"]))
    )
    steps = {"uncompressed": scaled(mean_of(updates), first_step_factor(cfg, len(updates)))}
    steps["shrunk"] = jax.tree_util.tree_map(
        lambda s, r: float(r) * s, steps["uncompressed"], rates
    )
    steps["leaf_means"] = leaf_means(steps["uncompressed"])
    steps["without_leaf_means"] = jax.tree_util.tree_map(
        np.subtract, steps["uncompressed"], steps["leaf_means"]
    )
    # the min-norm Rec is linear and round 1 has one matrix: mean Rec(Delta_n) = Rec(mean Delta_n)
    for kind in kinds:
        compressor = LayerwiseCompressor(reference, rates, kind, compression["seed"])
        steps[kind] = reconstructed(compressor, steps["uncompressed"])
        if kind == "block":
            steps["block_residual"] = jax.tree_util.tree_map(
                np.subtract, steps["uncompressed"], steps["block"]
            )
            # round 1 of ``compression.refresh='round'``
            sizes = [op.shape[1] for op in compressor.operators]
            steps["block_refreshed"] = reconstructed(
                compressor, steps["uncompressed"], round_permutations(sizes, compression["seed"], 1)
            )
            steps["block_signed"] = reconstructed(
                compressor,
                steps["uncompressed"],
                signs=layer_signs(tuple(sizes), compression["seed"]),
            )
    return steps, rates


def probe(workdir: str, per_client: int, kinds=KINDS) -> dict:
    cfg, _, model, x, owner, initial = run_context(workdir, per_client)
    updates, w1 = round_one_updates(workdir, cfg["pfldyn"]["alpha"])
    steps, rates = directions(cfg, initial, updates, kinds)
    checkpoint_move = jax.tree_util.tree_map(
        lambda a, b: np.asarray(a) - np.asarray(b), w1, initial
    )
    report = {
        "rates": jax.tree_util.tree_map(float, rates),
        "compression_run": cfg["compression"] if cfg["compression"]["enabled"] else None,
        "initial": layer_readings(model, initial, x, owner),
        "directions": {},
        "uncompressed_leaf_means": jax.tree_util.tree_map(
            lambda v: float(np.mean(v)), steps["uncompressed"]
        ),
    }
    for name in ("block", "block_refreshed", "block_signed"):
        if name in steps:  # the run's own w_1 - w_0 is one of these when it ran that operator
            gap = jax.tree_util.tree_map(np.subtract, steps[name], checkpoint_move)
            report[name + "_vs_checkpoint"] = float(
                tree.l2_norm(gap) / tree.l2_norm(checkpoint_move)
            )
    for name, step in steps.items():
        report["directions"][name] = {
            "norm": float(tree.l2_norm(step)),
            "unit_common_share": unit_common_share(step),
            "leaf_mean_share": leaf_mean_share(step),
            "along": {
                k: layer_readings(
                    model,
                    jax.tree_util.tree_map(lambda w, s, k=k: w + k * s, initial, step),
                    x,
                    owner,
                )
                for k in LINE_MULTIPLES
            },
        }
    return report


def summary_line(name: str, direction: dict) -> str:
    spread = lambda r: list(r.values())[-1]["feature_spread"]  # noqa: E731  (the output layer is last)
    dead = lambda r: max(v.get("dead", 0.0) for v in r.values())  # noqa: E731
    shares = ", ".join(
        f"{layer} {share:.2f}/{direction['leaf_mean_share'][layer]:.2f}"
        for layer, share in direction["unit_common_share"].items()
    )
    line = ", ".join(
        f"k={k}: spread {spread(r):.3g} dead<= {dead(r):.2f}" for k, r in direction["along"].items()
    )
    return (
        f"  {name:15s} |s| {direction['norm']:.3g}; common to all units / leaf means: {shares}\n   "
        f" {line}"
    )


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "workdir", help="a run folder with the round-1 checkpoint (clients' g_n included)"
    )
    p.add_argument(
        "--per-client", type=int, default=30, help="training examples sampled from each client"
    )
    p.add_argument(
        "--kinds",
        nargs="*",
        default=list(KINDS),
        choices=KINDS,
        help="operators to reconstruct with",
    )
    p.add_argument("--out", default="", help="JSON file for every reading")
    args = p.parse_args(argv)
    report = probe(args.workdir, args.per_client, tuple(args.kinds))
    spread0 = list(report["initial"].values())[-1]["feature_spread"]
    checks = "; ".join(f"{k}: {v:.2e}" for k, v in report.items() if k.endswith("_vs_checkpoint"))
    print(
        f"{args.workdir}: rates {report['rates']}; relative distance to the checkpoint's w_1 - w_0:"
        f" {checks}; feature spread at w_0 {spread0:.3g}"
    )
    print(f"  each leaf's mean entry of the uncompressed step: {report['uncompressed_leaf_means']}")
    for name, direction in report["directions"].items():
        print(summary_line(name, direction))
    if args.out:
        write_json(args.out, stamped(report))


if __name__ == "__main__":
    main()
