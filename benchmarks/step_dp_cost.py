"""What one DP-SGD local step costs against a plain minibatch gradient (issue 18; seed 003's
method).

For each model, one step on a batch of B examples is timed three ways in this one process:

  batch        the plain mean gradient of the batch (no privacy): the floor
  dp_sgd       ``privacy.mechanisms.step_dp.ClippedNoisyGradient`` as shipped: dense layers by
               book-keeping (their per-example norms and clipped sum from inputs and output
               gradients, ``privacy.mechanisms.ghost_clipping``), per-example gradients of the other
               parameters, Gaussian noise
  per_example  the same hook with ``dense_bookkeeping=False``: every parameter's per-example
               gradient, each example clipped to C, summed by a contraction with the clip weights
               (the code before book-keeping)
  reduce_sum   per-example gradients summed by ``jnp.sum(axis=0)`` (the code before the
               contraction): XLA:CPU fused the per-example gradient into that reduce

Ratios (``dp_sgd / batch``, ``per_example / dp_sgd``, ``reduce_sum / per_example``) are measured in
one run; the seconds depend on the machine (say which). JSON out.

    python benchmarks/step_dp_cost.py --out benchmarks/out/step_dp_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))
sys.path.insert(1, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from fedjax_dp.models import get_model  # noqa: E402
from fedjax_dp.privacy.mechanisms.clipping import clip_by_global_norm  # noqa: E402
from fedjax_dp.privacy.mechanisms.gaussian import add_gaussian_noise  # noqa: E402
from fedjax_dp.training.results import write_json  # noqa: E402
from fedjax_dp.privacy.mechanisms.step_dp import ClippedNoisyGradient  # noqa: E402
from timing import timed  # noqa: E402

MODELS = {"cnn_fedavg": (28, 28, 1), "mlp_2nn": (28, 28, 1), "cnn_pfl": (32, 32, 3)}


def reduce_sum_step(model, params, batch, mask, key, clip_norm=1.0, noise_multiplier=1.0):
    """The pre-fix hook: stack of clipped per-example gradients, summed with a reduce."""

    def one(p, example):
        return model.per_example_loss(p, jax.tree_util.tree_map(lambda x: x[None], example), key)[0]

    grads = jax.vmap(jax.grad(one), in_axes=(None, 0))(params, batch)
    clipped = jax.vmap(lambda g: clip_by_global_norm(g, clip_norm).clipped)(grads)
    summed = jax.tree_util.tree_map(
        lambda g: jnp.sum(
            jnp.where(mask.reshape(mask.shape + (1,) * (g.ndim - 1)), g, 0.0), axis=0
        ),
        clipped,
    )
    return add_gaussian_noise(summed, noise_multiplier * clip_norm, key)


def measure(name, batch_size, conv_impl, repeats):
    shape = MODELS[name]
    model = get_model(name, shape, 10, conv_impl=conv_impl)
    params = model.init(jax.random.key(0))
    keys = jax.random.split(jax.random.key(1), 2)
    batch = {
        "x": jax.random.normal(keys[0], (batch_size,) + shape),
        "y": jax.random.randint(keys[1], (batch_size,), 0, 10),
    }
    mask = jnp.ones(batch_size, bool)
    key = jax.random.key(2)
    hook = ClippedNoisyGradient(1.0, 1.0)
    per_example_hook = ClippedNoisyGradient(1.0, 1.0, dense_bookkeeping=False)
    variants = {
        "batch": jax.jit(
            lambda p: jax.grad(lambda q: model.per_example_loss(q, batch, key).mean())(p)
        ),
        "dp_sgd": jax.jit(lambda p: hook(model.per_example_loss, p, batch, mask, key)),
        "per_example": jax.jit(
            lambda p: per_example_hook(model.per_example_loss, p, batch, mask, key)
        ),
        "reduce_sum": jax.jit(lambda p: reduce_sum_step(model, p, batch, mask, key)),
    }
    row = {"model": name, "batch_size": batch_size, "conv_impl": conv_impl}
    for label, fn in variants.items():
        first, median = timed(lambda: fn(params), repeats)
        row[f"{label}_s"], row[f"{label}_first_call_s"] = median, first
    row["dp_sgd_over_batch"] = row["dp_sgd_s"] / row["batch_s"]
    row["per_example_over_dp_sgd"] = row["per_example_s"] / row["dp_sgd_s"]
    row["reduce_sum_over_per_example"] = row["reduce_sum_s"] / row["per_example_s"]
    print(json.dumps(row), flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", nargs="+", default=["cnn_fedavg", "mlp_2nn", "cnn_pfl"], choices=sorted(MODELS)
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--conv-impl", default="xla", choices=("xla", "im2col"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rows = [measure(m, args.batch_size, args.conv_impl, args.repeats) for m in args.models]
    report = {
        "benchmark": "step_dp_cost",
        "machine": platform.platform(),
        "devices": str(jax.devices()),
        "cpu_count": os.cpu_count(),
        "rows": rows,
    }
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()
