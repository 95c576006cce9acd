"""The global evaluation's forward pass: convolution form and batch size (``training.evaluation``).

Times ``per_example_stats`` over 10,000 random images of each model's input shape for each
convolution form the training engine may pick (the model handed to the evaluation) and each batch
size, the cases alternated ``--passes`` times in this one process after a first (compiling) call
each: ``raw`` calls the jitted batch function on the model as given (what the evaluation did before
it switched to ``models.evaluation_model``), ``evaluation`` calls ``per_example_stats`` as the
library does now. JSON out; numbers depend on the machine.

    python benchmarks/evaluation_pass.py --out benchmarks/out/evaluation_pass.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_dp.models import evaluation_model, get_model  # noqa: E402
from fedjax_dp.training import evaluation  # noqa: E402
from fedjax_dp.training.results import write_json  # noqa: E402

SHAPES = {"cnn_fedavg": (28, 28, 1), "cnn_pfl": (32, 32, 3), "mlp_2nn": (28, 28, 1)}


def pass_seconds(model, params, x, y, batch_size: int, raw: bool) -> float:
    """One pass over ``x`` in batches; ``raw`` keeps the model's own convolutions (the old
    evaluation)."""
    real = evaluation.evaluation_model
    if raw:
        evaluation.evaluation_model = lambda m: m
    try:
        start = time.perf_counter()
        evaluation.per_example_stats(model, params, x, y, batch_size)
        return time.perf_counter() - start
    finally:
        evaluation.evaluation_model = real


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=["cnn_fedavg", "cnn_pfl"])
    p.add_argument(
        "--conv-impls", nargs="+", default=["im2col", "xla"], help="the form training picked"
    )
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[250, 1000])
    p.add_argument("--images", type=int, default=10_000)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--out", default="")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    cases, rows = [], []
    for name in args.models:
        x = rng.random((args.images,) + SHAPES[name], np.float32)
        y = rng.integers(0, 10, args.images).astype(np.int32)
        for impl in args.conv_impls:
            model = get_model(name, SHAPES[name], 10, conv_impl=impl)
            params = model.init(jax.random.key(0))
            for batch in args.batch_sizes:
                for raw in (True, False):
                    if raw and evaluation_model(model) == model:
                        continue  # nothing to compare: the model already has XLA convolutions
                    case = {
                        "model": name,
                        "trained_with": impl,
                        "batch": batch,
                        "evaluated_with": impl if raw else "xla (evaluation_model)",
                        "raw": raw,
                    }
                    case["first_s"] = pass_seconds(model, params, x[:batch], y[:batch], batch, raw)
                    cases.append((case, model, params, x, y))
    for _ in range(args.passes):
        for case, model, params, x, y in cases:
            case.setdefault("pass_s", []).append(
                round(pass_seconds(model, params, x, y, case["batch"], case["raw"]), 3)
            )
    for case, *_ in cases:
        case["median_s"] = statistics.median(case["pass_s"])
        rows.append(case)
        print(
            f"{case['model']:<11} trained {case['trained_with']:<7} evaluated"
            f" {case['evaluated_with']:<22} batch {case['batch']:>5}: {case['median_s']:.2f} s"
            f" ({case['pass_s']})",
            flush=True,
        )
    report = {
        "machine": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "images": args.images,
        "rows": rows,
    }
    if args.out:
        write_json(args.out, report, indent=2)


if __name__ == "__main__":
    main()
