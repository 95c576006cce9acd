"""Cost of one UGA client vs one FedAvg client as local steps grow (issue 6 benchmark).

For each model and number of local steps S (6 to 600, batch 10), jitted single-client programs at
the same E = 2 passes over a client of S * 10 examples: FedAvg ClientUpdate (2 epochs = 2S steps),
UGA (1 keep-trace epoch of S steps, then the whole-data gradient evaluation, grad through
everything), UGA rematerialised per step and in sqrt(S)-step segments, first-order UGA. Measured in
ONE run so ratios are
comparable: median wall time of 3 calls after compilation, and XLA's own memory analysis of each
compiled program (temporary buffers: exact and noise-free, unlike sampled RSS). Targets: UGA time
<= 3x FedAvg's; with remat, the temporary memory grows per step by no more than the carried state
(parameters + optimizer state), i.e. the slope in bytes/step is <= the parameter bytes (per-step
remat); sqrt(S) segments grow as sqrt(S) states.

    python benchmarks/uga_cost.py --out benchmarks/out/uga_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import numpy as np
import optax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xla_cost import compiled_cost, write_result  # noqa: E402

from fedjax_dp.algorithms.fedavg import FedAvg  # noqa: E402
from fedjax_dp.algorithms.uga import make_uga_gradient  # noqa: E402
from fedjax_dp.core import tree  # noqa: E402
from fedjax_dp.data.packing import pack_cohort, pack_uga_cohort  # noqa: E402
from fedjax_dp.models import get_model  # noqa: E402

BATCH = 10


def client_arrays(steps: int, shape, num_classes: int, uga: bool):
    """One client with ``steps * BATCH`` examples, packed for one keep-trace epoch (+
    evaluation)."""
    rng = np.random.default_rng(0)
    n = steps * BATCH
    x, y = rng.standard_normal((n,) + shape).astype(np.float32), rng.integers(0, num_classes, n)
    if uga:  # E = 2: one epoch of S keep-trace steps, then the whole data once
        # eval batch = BATCH, the loop default
        packed = pack_uga_cohort(x, y, [np.arange(n)], BATCH, 2, rng)
    else:
        packed = pack_cohort(x, y, [np.arange(n)], BATCH, 2, rng)
    client = jax.tree_util.tree_map(lambda a: jax.numpy.asarray(a[0]), packed)
    client["key"] = jax.random.key(1)
    return client


def run(model_name: str, step_counts, conv_impl: str) -> list[dict]:
    shape = (28, 28, 1)
    model = get_model(model_name, shape, 10, conv_impl=conv_impl)
    params = model.init(jax.random.key(0))
    opt = optax.sgd(0.05)
    # (params, client, lr_scale) -> (delta, stats, ok)
    fedavg = FedAvg(model.per_example_loss, opt).local_upload
    variants = {
        "uga": make_uga_gradient(model.per_example_loss, opt),
        "uga_remat_step": make_uga_gradient(model.per_example_loss, opt, remat=True),
        "uga_remat_sqrt": make_uga_gradient(model.per_example_loss, opt, remat="sqrt"),
        "uga_first_order": make_uga_gradient(model.per_example_loss, opt, first_order=True),
    }
    rows = []
    for steps in step_counts:
        row = {"model": model_name, "steps": steps, "param_bytes": 4 * tree.num_params(params)}
        row["fedavg"] = compiled_cost(
            lambda p, c: fedavg(p, c, 1.0)[0], params, client_arrays(steps, shape, 10, False)
        )
        uga_client = client_arrays(steps, shape, 10, True)
        for name, fn in variants.items():
            row[name] = compiled_cost(lambda p, c, fn=fn: fn(p, c)[0], params, uga_client)
            row[name]["time_ratio_vs_fedavg"] = row[name]["seconds"] / row["fedavg"]["seconds"]
        rows.append(row)
        print(
            f"{model_name:10s} S={steps:4d}  fedavg {row['fedavg']['seconds'] * 1e3:8.1f} ms "
            + "  ".join(
                f"{n} {row[n]['seconds'] * 1e3:8.1f} ms ({row[n]['time_ratio_vs_fedavg']:.2f}x, "
                f"{row[n]['temp_bytes'] / 2**20:7.1f} MiB)"
                for n in variants
            ),
            flush=True,
        )
    return rows


def slopes(rows, param_bytes) -> dict:
    """Bytes of temporary memory per extra local step, fitted over the step counts."""
    steps = np.array([r["steps"] for r in rows], float)
    out = {}
    for name in ("fedavg", "uga", "uga_remat_step", "uga_remat_sqrt", "uga_first_order"):
        mem = np.array([r[name]["temp_bytes"] for r in rows], float)
        slope = float(np.polyfit(steps, mem, 1)[0]) if len(rows) > 1 else float("nan")
        out[name] = {"bytes_per_step": slope, "in_param_sizes": slope / param_bytes}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp_2nn", "cnn_fedavg"])
    parser.add_argument("--steps", nargs="+", type=int, default=[6, 60, 600])
    parser.add_argument("--cnn-steps", nargs="+", type=int, default=[6, 30, 120])
    parser.add_argument("--conv-impl", default="im2col")
    parser.add_argument("--out", default=os.path.join("benchmarks", "out", "uga_cost.json"))
    args = parser.parse_args()
    result = {"batch_size": BATCH, "models": {}}
    for name in args.models:
        rows = run(name, args.cnn_steps if name.startswith("cnn") else args.steps, args.conv_impl)
        result["models"][name] = {
            "rows": rows,
            "memory_slope": slopes(rows, rows[0]["param_bytes"]),
        }
        print(json.dumps(result["models"][name]["memory_slope"], indent=1))
    write_result(args.out, result)


if __name__ == "__main__":
    main()
