"""Which CPU engine runs DP-SGD clients of a conv model fastest (``core.strategy``'s ``per_example``
rule).

A client that clips every example's gradient (seed 003's local DP-SGD, DP-SCAFFOLD) takes
per-example gradients of every convolution inside its local steps. One round of a shipped setting is
timed with the engine each way, in this one process, the engines alternated:

  unrolled_xla   what ``auto`` chose before 2026-12-02 for a loop-free client of <= 32 steps: a loop
                 over the clients (a CPU device per core), every local step unrolled, XLA
                 convolutions
  scan_im2col    what it chooses now: the local steps in a ``lax.scan``, im2col convolutions, the
                 cohort as a mesh over the same devices

``first_s`` is the first call (compiling the round's programs), ``median_s`` the median of later
calls. The two engines' rounds are also compared (largest parameter difference after the round:
float summation order only).
Settings: ``ldp_minibatch_mnist`` (embedded MNIST, the FedAvg CNN, 10 clients x 10 steps of B = 16)
and, where the CIFAR-10 files are (``FEDJAX_DP_DATA`` or ``../shared/data``), DP-SCAFFOLD on
``cuag_pfl_cifar10`` (``cnn_pfl``, 10 clients x 25 steps of B = 50, fixed clip). JSON out; times
depend on the machine (say which).

    python benchmarks/dp_sgd_engine.py --out benchmarks/out/dp_sgd_engine.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_dp import configs  # noqa: E402
from fedjax_dp.core import rng as rng_lib  # noqa: E402
from fedjax_dp.core.client_states import ClientStateStore  # noqa: E402
from fedjax_dp.core.host_devices import cpu_devices  # noqa: E402
from fedjax_dp.data.builders import build_dataset  # noqa: E402
from fedjax_dp.training.build import build_model_and_round, privacy_tracker  # noqa: E402
from fedjax_dp.training.cohorts import cohort_slots, make_packer, sample_cohort  # noqa: E402
from fedjax_dp.training.results import write_json  # noqa: E402
from fedjax_dp.core.host_devices import use_a_device_per_core  # noqa: E402

use_a_device_per_core()  # what a run gets (Experiment asks the same), before JAX starts

sys.path.insert(0, HERE)
from timing import timed  # noqa: E402

ENGINES = {
    "unrolled_xla": {"strategy": "loop", "unroll": "full", "conv_impl": "xla"},
    "scan_im2col": {"strategy": "sequential", "unroll": "1", "conv_impl": "im2col"},
}
SETTINGS = {
    "ldp_minibatch_mnist": ("ldp_minibatch_mnist", {}),
    "dp_scaffold_cifar10": (
        "cuag_pfl_cifar10",
        {"algorithm": "dp_scaffold", "compression.enabled": False, "dp_scaffold.clip": "fixed"},
    ),
}


def prepared_round(spec: str, overrides: dict, engine: dict):
    """``(call, choice)``: ``call()`` runs round 1 of the setting with ``engine`` on a fixed
    cohort."""
    cfg = configs.get(spec, overrides)
    cfg.engine.update(num_devices=len(cpu_devices()), **engine)
    dataset = build_dataset(cfg.data, cfg.seed)
    choice, model, runner = build_model_and_round(cfg, dataset)
    algorithm = runner.algorithm
    state = runner.init(model.init(jax.random.key(0)), jax.random.key(1))
    store = (
        ClientStateStore(algorithm.client_state_init(state.params))
        if algorithm.requirements.client_state
        else None
    )
    ids = sample_cohort(cfg, dataset.num_clients, np.random.default_rng(0))
    cohort = make_packer(cfg, dataset, algorithm.requirements)(
        ids, np.random.default_rng(1), cohort_slots(cfg, dataset.num_clients, len(ids))
    )
    slots = cohort["mask"].shape[0]
    cohort["client_id"] = np.pad(np.asarray(ids, np.int32), (0, slots - len(ids)))
    step_noise = privacy_tracker(cfg, runner, dataset).step_inputs(1, ids, slots)
    stacked = store.gather(ids, slots) if store is not None else None
    uploads = runner.specialized(state)
    key = rng_lib.round_key(jax.random.key(0), 1)
    return (
        lambda: (
            runner(
                state, cohort, key, 1, stacked, uploads, noise_key=key, step_noise=step_noise
            ).state.params
        ),
        choice,
    )


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--repeats", type=int, default=3, help="timed calls after the first, per pass")
    p.add_argument("--passes", type=int, default=2, help="alternations of the two engines")
    p.add_argument("--out", default="")
    args = p.parse_args()
    result = {
        "benchmark": "dp_sgd_engine",
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "backend": jax.default_backend(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "settings": {},
    }
    for name in args.settings:
        spec, overrides = SETTINGS[name]
        try:
            calls = {
                engine: prepared_round(spec, overrides, options)
                for engine, options in ENGINES.items()
            }
        except (FileNotFoundError, OSError) as error:  # CIFAR-10 files absent
            print(f"{name}: skipped ({error})", flush=True)
            continue
        rows = {
            engine: {"engine": str(choice), "first_s": [], "median_s": []}
            for engine, (_, choice) in calls.items()
        }
        for _ in range(args.passes):
            for engine, (call, _) in calls.items():
                jax.clear_caches()  # every pass compiles afresh: first_s is the compile a run pays
                first, median = timed(call, args.repeats)
                rows[engine]["first_s"].append(first)
                rows[engine]["median_s"].append(median)
                print(
                    f"{name:22s} {engine:13s} first {first:6.2f} s  median {median:6.3f} s",
                    flush=True,
                )
        outs = [call() for call, _ in calls.values()]
        difference = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(jax.tree_util.tree_leaves(outs[0]), jax.tree_util.tree_leaves(outs[1]))
        )
        old, new = (min(rows[e]["median_s"]) for e in ENGINES)
        compile_old, compile_new = (min(rows[e]["first_s"]) for e in ENGINES)
        result["settings"][name] = {
            "engines": rows,
            "round_speedup": old / new,
            "first_call_speedup": compile_old / compile_new,
            "max_parameter_difference": difference,
        }
        print(
            f"{name}: round {old / new:.2f}x, first call {compile_old / compile_new:.2f}x, "
            f"parameters differ by at most {difference:.2e}",
            flush=True,
        )
    if args.out:
        write_json(args.out, result, indent=2)
    print(
        json.dumps(
            {
                k: {m: v[m] for m in ("round_speedup", "first_call_speedup")}
                for k, v in result["settings"].items()
            }
        )
    )


if __name__ == "__main__":
    main()
