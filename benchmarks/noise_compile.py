"""XLA compile time of the DP noise draw (``privacy.mechanisms.gaussian.gaussian_noise_like``) for
the repository's models, the flat draw it makes now against drawing each leaf's (NOISE_DRAWS,
*shape) directly (the values are equal: tests/test_clipping_and_noise.py). Each formulation is
compiled in a fresh process (no in-memory or persistent cache), alternating, ``--repeats`` times;
the JSON keeps every time and the medians' ratio.

    python benchmarks/noise_compile.py --out benchmarks/out/noise_compile.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = {
    "cnn_fedavg": ((28, 28, 1), 10),
    "cnn_pfl": ((32, 32, 3), 10),
    "mlp_2nn": ((28, 28, 1), 10),
}

_CHILD = """
import json, sys, time
import jax, jax.numpy as jnp
from fedjax_dp.models import get_model
from fedjax_dp.privacy.mechanisms import gaussian as mechanisms
name, shape = sys.argv[1], tuple(json.loads(sys.argv[2]))
classes, formulation = int(sys.argv[3]), sys.argv[4]
if formulation == "direct":
    def direct(key, shape, dtype=jnp.float32):
        draws = jax.random.normal(
            key, (mechanisms.NOISE_DRAWS,) + tuple(shape), mechanisms.noise_dtype(dtype))
        return jnp.sum(draws, axis=0) / jnp.sqrt(jnp.asarray(mechanisms.NOISE_DRAWS, draws.dtype))
    mechanisms.standard_normal = direct
params = get_model(name, shape, classes).init(jax.random.key(0))
start = time.perf_counter()
noise = jax.jit(lambda p, k: mechanisms.gaussian_noise_like(p, 1.0, k))
noise.lower(params, jax.random.key(1)).compile()
print(json.dumps(time.perf_counter() - start))
"""


def compile_seconds(model: str, formulation: str) -> float:
    shape, classes = MODELS[model]
    env = dict(
        os.environ, JAX_COMPILATION_CACHE_DIR="", JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "")
    )
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, model, json.dumps(shape), str(classes), formulation],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/out/noise_compile.json")
    args = parser.parse_args()
    from fedjax_dp.training.results import write_json

    rows = []
    for model in MODELS:
        times = {"flat": [], "direct": []}
        for _ in range(args.repeats):
            for formulation in times:
                times[formulation].append(compile_seconds(model, formulation))
        median = {k: statistics.median(v) for k, v in times.items()}
        rows.append(
            {
                "model": model,
                "compile_s": times,
                "median_s": median,
                "direct_over_flat": median["direct"] / median["flat"],
            }
        )
        print(
            f"{model:10s} direct {median['direct']:.2f} s  flat {median['flat']:.2f} s  "
            f"ratio {rows[-1]['direct_over_flat']:.2f}",
            flush=True,
        )
    write_json(args.out, {"benchmark": "noise_compile", "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
