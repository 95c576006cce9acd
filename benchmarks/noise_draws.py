"""What one DP noise draw costs, as shipped against its earlier form, in one process
(``core.unrolled_threefry``, ``privacy.mechanisms.gaussian.standard_normal``).

For each model's parameter tree, timed both ways in this one run:

  noise      ``mechanisms.gaussian_noise_like`` (one draw of N(0, sigma^2 I) for the whole model:
             the central noise of a DP-FedAvg round, a client's local noise, a DP-SGD step's noise)
  dp_sgd     one DP-SGD local step, ``privacy.mechanisms.step_dp.ClippedNoisyGradient`` at B = 16
             (per-example gradients, clipping, noise)

  matrices   one compressed-sensing measurement Phi x with a matrix-free random Phi
             (``compression.operators .RandomMatrix``, Gaussian and Bernoulli, CUAG-PFL's CNN size
             73,882 at rate 0.3): its entries are drawn tile by tile from the shared seed at every
             product

``before``: threefry's rolled loop (JAX's CPU lowering) and ``jnp.sum`` over the NOISE_DRAWS axis,
as the code was; ``now``: the unrolled threefry and the fused additions. Each: the best mean of
back-to-back calls, and the first call's seconds (noise, DP-SGD: compilation included) or the
compile seconds (matrices). The ratios are measured in this one run; the seconds depend on the
machine (say which). JSON out.

    python benchmarks/noise_draws.py --out benchmarks/out/noise_draws.json
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))
sys.path.insert(1, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from fedjax_dp.compression import operators  # noqa: E402
from fedjax_dp.models import get_model  # noqa: E402
from fedjax_dp.privacy.mechanisms import gaussian as mechanisms  # noqa: E402
from fedjax_dp.privacy.mechanisms.step_dp import ClippedNoisyGradient  # noqa: E402
from timing import best_ms, timed  # noqa: E402
from xla_cost import write_result  # noqa: E402

MODELS = {"mlp_2nn": (28, 28, 1), "cnn_fedavg": (28, 28, 1), "cnn_pfl": (32, 32, 3)}


def standard_normal_before(key, shape, dtype=jnp.float32):
    """``mechanisms.standard_normal`` before the change: JAX's own threefry key, a reduce over the
    draws."""
    shape = (mechanisms.NOISE_DRAWS,) + tuple(shape)
    draws = jax.random.normal(key, (math.prod(shape),), mechanisms.noise_dtype(dtype)).reshape(
        shape
    )
    return jnp.sum(draws, axis=0) / jnp.sqrt(jnp.asarray(mechanisms.NOISE_DRAWS, draws.dtype))


@contextlib.contextmanager
def formulation(name: str):
    """``now`` leaves the module alone; ``before`` puts the earlier draw in its place for the
    duration."""
    shipped = mechanisms.standard_normal
    if name == "before":
        mechanisms.standard_normal = standard_normal_before
    try:
        yield
    finally:
        mechanisms.standard_normal = shipped


def measure(model_name: str, calls: int) -> dict:
    shape = MODELS[model_name]
    model = get_model(model_name, shape, 10)
    params = model.init(jax.random.key(0))
    batch = {
        "x": jax.random.normal(jax.random.key(1), (16,) + shape),
        "y": jnp.zeros(16, jnp.int32),
    }
    mask, key = jnp.ones(16, bool), jax.random.key(2)
    row = {
        "model": model_name,
        "parameters": sum(int(x.size) for x in jax.tree_util.tree_leaves(params)),
    }
    for name in ("before", "now"):
        # fresh jitted functions: each formulation traced and compiled on its own
        with formulation(name):
            noise = jax.jit(lambda p, k: mechanisms.add_gaussian_noise(p, 1.0, k))
            step = jax.jit(
                lambda p, b: ClippedNoisyGradient(1.0, 1.0)(model.per_example_loss, p, b, mask, key)
            )
            row[f"noise_{name}_first_call_s"], _ = timed(lambda: noise(params, key), repeats=1)
            row[f"noise_{name}_ms"] = best_ms(noise, params, key, calls=calls)
            row[f"dp_sgd_{name}_first_call_s"], _ = timed(lambda: step(params, batch), repeats=1)
            row[f"dp_sgd_{name}_ms"] = best_ms(step, params, batch, calls=max(3, calls // 5))
    row["noise_speedup"] = row["noise_before_ms"] / row["noise_now_ms"]
    row["dp_sgd_speedup"] = row["dp_sgd_before_ms"] / row["dp_sgd_now_ms"]
    return row


def measure_matrices(calls: int, size: int = 73_882, rate: float = 0.3) -> list[dict]:
    """Phi x for matrix-free Gaussian and Bernoulli matrices, the tiles' key as shipped (``now``)
    and as JAX's own threefry key (``before``); the products are equal to the bit (checked here)."""
    rows = []
    x = jax.random.normal(jax.random.key(0), (size,))
    for kind in ("gaussian", "bernoulli"):
        row = {"matrix": kind, "size": size, "rate": rate}
        outputs = {}
        for name in ("before", "now"):
            shipped = operators.unrolled
            if name == "before":
                operators.unrolled = lambda key: key
            try:
                start = time.perf_counter()
                measure = (
                    jax.jit(operators.RandomMatrix(size=size, rate=rate, seed=3, kind=kind).measure)
                    .lower(x)
                    .compile()
                )
                row[f"measure_{name}_compile_s"] = time.perf_counter() - start
                row[f"measure_{name}_ms"] = best_ms(measure, x, calls=calls, repeats=2)
                outputs[name] = measure(x)
            finally:
                operators.unrolled = shipped
        row["equal"] = bool(jnp.array_equal(outputs["before"], outputs["now"]))
        row["measure_speedup"] = row["measure_before_ms"] / row["measure_now_ms"]
        rows.append(row)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument(
        "--calls",
        type=int,
        default=20,
        help="back-to-back calls per timing (fewer for the DP-SGD step)",
    )
    p.add_argument(
        "--no-matrices", action="store_true", help="skip the measurement matrices (about a minute)"
    )
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    result = {
        "benchmark": "noise_draws",
        "processor": platform.processor() or platform.machine(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": [],
    }
    for name in args.models:
        row = measure(name, args.calls)
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        result["rows"].append(row)
    if not args.no_matrices:
        for row in measure_matrices(calls=1):
            print(row, flush=True)
            result["rows"].append(row)
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()
