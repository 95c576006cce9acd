"""Seeds (or a sweep's grid) in one vmapped program against the same runs one after another
(issue 89, item 3).

For each shipped config (``dp_fedavg_mnist``, ``fedavg_mnist``), ``Experiment.run_seeds`` of
``--seeds`` seeds with ``vectorized=True`` (``training.run_batch``) and without, each in a fresh
process (as a user runs ``fedjax-dp --seeds ... [--vectorize]``: data loading, compilation,
evaluation, accounting and writing included; the persistent XLA cache is off), the two modes
alternated ``--repeats`` times. Written (JSON): every wall time, the medians and the throughput
ratio sequential / vectorized, measured in this one run on this machine.

    python benchmarks/vectorized_seeds.py --out benchmarks/measured/vectorized_seeds.json

``--grid``: instead of seeds, ``fedjax_dp.sweep`` over ``GRID`` (clip norm x client learning rate x
server learning rate: 8 runs, every point once) with ``vectorized=True`` and without.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ("dp_fedavg_mnist", "fedavg_mnist")
MODES = ("sequential", "vectorized")
GRID = {
    "dp.clip_norm": [0.5, 1.0],
    "client.learning_rate": [0.05, 0.1],
    "server.learning_rate": [0.5, 1.0],
}


def child(config: str, mode: str, seeds: int, workdir: str) -> None:
    """One measurement in this process: prints the seconds of ``run_seeds`` (``seeds`` 0: of the
    sweep over ``GRID``)."""
    import fedjax_dp

    experiment = fedjax_dp.Experiment(config)
    vectorized = mode == "vectorized"
    start = time.perf_counter()
    if seeds:
        experiment.run_seeds(list(range(seeds)), workdir, vectorized=vectorized, progress=False)
    else:
        fedjax_dp.sweep(
            experiment, GRID, workdir=workdir, runs="fixed", vectorized=vectorized, progress=False
        )
    print(json.dumps({"seconds": time.perf_counter() - start}))


def measure(config: str, mode: str, seeds: int) -> float:
    env = {**os.environ, "FEDJAX_DP_COMPILATION_CACHE": "off", "PYTHONPATH": ROOT}
    with tempfile.TemporaryDirectory() as workdir:
        out = subprocess.run(
            [sys.executable, __file__, "--child", config, mode, str(seeds), workdir],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--out", default="benchmarks/measured/vectorized_seeds.json")
    parser.add_argument("--grid", action="store_true", help="a sweep over GRID, not seeds")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    runs = 0 if args.grid else args.seeds
    if args.child:
        config, mode, seeds, workdir = args.child
        child(config, mode, int(seeds), workdir)
        return
    import jax

    seconds = {c: {m: [] for m in MODES} for c in args.configs}
    for repeat in range(args.repeats):
        order = MODES if repeat % 2 == 0 else MODES[::-1]
        for config in args.configs:
            for mode in order:
                seconds[config][mode].append(measure(config, mode, runs))
                print(config, mode, round(seconds[config][mode][-1], 1), flush=True)
    median = {c: {m: statistics.median(v) for m, v in s.items()} for c, s in seconds.items()}
    out = {
        "benchmark": "vectorized_seeds",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "seeds": None if args.grid else args.seeds,
        "grid": GRID if args.grid else None,
        "repeats": args.repeats,
        "what": (
            f"{'fedjax_dp.sweep' if args.grid else 'Experiment.run_seeds'} wall time in a fresh"
            " process (persistent XLA cache off)"
        ),
        "seconds": seconds,
        "median_seconds": median,
        "throughput_ratio_vectorized_over_sequential": {
            c: m["sequential"] / m["vectorized"] for c, m in median.items()
        },
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out["throughput_ratio_vectorized_over_sequential"], indent=1))


if __name__ == "__main__":
    main()
