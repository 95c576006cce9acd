"""Where one round of a real seed-paper workload spends its time (issue 20, item 4).

For a shipped config (default ``fedavg_femnist``: FEMNIST by writer, the FedAvg CNN, 10 writers a
round, E = 5, B = 64) and variants of it built in this one process, one round is timed in stages:

  pack        drawing the cohort and gathering its padded batches (host, numpy)
  clients     local training and every client-side upload transform (clip, local noise,
              compression), summed over the cohort inside the engine: one compiled program
  server      cohort-level transforms (central noise, reconstruction), aggregation, server update
  accounting  the privacy tracker's bookkeeping for the round and its epsilon (host, dp_accounting)
  evaluate    the global model on the whole test set

Variants: ``plain`` (the config), ``dp`` (the same as DP-FedAvg: clip to S = 1, central Gaussian
noise z = 1, RDP), ``dp+cs`` (and compressed-sensing uploads, Alg. 2 rates): so the cost of privacy
is ``dp`` - ``plain`` per stage and of compression ``dp+cs`` - ``dp``. Each stage: the median of
``--repeats`` calls after a first (compiling) one. JSON out; numbers depend on the machine (say
which).

    python benchmarks/round_split.py --out benchmarks/out/round_split.json
    python benchmarks/round_split.py --config uga_fedmeta_femnist --variants plain
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
from fedjax_dp.core.round import client_inputs  # noqa: E402
from fedjax_dp.data.builders import build_dataset  # noqa: E402
from fedjax_dp.models import get_model  # noqa: E402
from fedjax_dp.training.build import build_round, privacy_tracker, resolve_engine  # noqa: E402
from fedjax_dp.training.cohorts import cohort_slots, make_packer, sample_cohort  # noqa: E402
from fedjax_dp.training.evaluation import evaluate_state  # noqa: E402
from fedjax_dp.training.results import write_json  # noqa: E402
from fedjax_dp.core.host_devices import use_a_device_per_core  # noqa: E402

use_a_device_per_core()  # what a run gets (Experiment asks the same), before JAX starts

sys.path.insert(0, HERE)
from timing import timed as first_and_median  # noqa: E402

VARIANTS = {
    "plain": {},
    "dp": {"algorithm": "dp_fedavg", "dp.noise_multiplier": 1.0, "dp.clip_norm": 1.0},
    "dp+cs": {
        "algorithm": "dp_fedavg",
        "dp.noise_multiplier": 1.0,
        "dp.clip_norm": 1.0,
        "compression.enabled": True,
    },
}


def timed(fn, repeats: int) -> dict:
    first, median = first_and_median(fn, repeats)
    return {"first_s": first, "median_s": median}


def split_round(cfg, dataset, repeats: int) -> dict:
    """The stages of one round of ``cfg`` on ``dataset`` (module docstring)."""
    choice = resolve_engine(cfg, True, cfg.sampling.cohort_size)
    model = get_model(
        cfg.model.name, dataset.example_shape, dataset.num_classes, conv_impl=choice.conv_impl
    )
    runner = build_round(cfg, model, choice, dataset.num_clients, None, dataset.train_sizes())
    algorithm = runner.algorithm
    state = runner.init(model.init(jax.random.key(0)), jax.random.key(1))
    store = (
        ClientStateStore(algorithm.client_state_init(state.params))
        if algorithm.requirements.client_state
        else None
    )
    pack = make_packer(cfg, dataset, algorithm.requirements)
    generator = np.random.default_rng(0)
    ids = sample_cohort(cfg, dataset.num_clients, generator)
    slots = cohort_slots(cfg, dataset.num_clients, len(ids))
    stages = {"pack": timed(lambda: pack(ids, np.random.default_rng(1), slots)["mask"], repeats)}
    cohort = pack(ids, np.random.default_rng(1), slots)
    cohort["client_id"] = np.resize(np.asarray(ids, np.int32), cohort["mask"].shape[0])
    uploads = runner.specialized(state)
    engine, server_step = runner._program(uploads)  # the two compiled programs of a round
    key = rng_lib.round_key(jax.random.key(0), 1)
    inputs = uploads.inputs(1)
    clients = client_inputs(cohort, key, key)
    if store is not None:
        clients["client_state"] = store.gather(cohort["client_id"])
    shared = (algorithm.broadcast(state), state.uploads, inputs)
    stages["clients"] = timed(lambda: engine(shared, clients), repeats)
    sums, per_client = engine(shared, clients)
    client_noise_keys = (clients["noise_key"], clients["count_key"])
    stages["server"] = timed(
        lambda: server_step(state, sums, per_client, key, key, inputs, client_noise_keys)[0],
        repeats,
    )
    tracker = privacy_tracker(cfg, runner, dataset)
    if tracker is not None:
        rounds = iter(range(1, 10**6))
        stages["accounting"] = timed(
            lambda: (
                tracker.record(next(rounds), ids, uploads.releases(1, state.uploads)),
                tracker.epsilon(),
            )[1],
            repeats,
        )
    stages["evaluate"] = timed(
        lambda: len(evaluate_state(model, algorithm, state, dataset, store)), repeats
    )
    total = sum(s["median_s"] for s in stages.values())
    return {
        "stages": stages,
        "round_s": total,
        "shares": {name: s["median_s"] / total for name, s in stages.items()},
        "cohort": int(len(ids)),
        "steps_per_client": int(cohort["mask"].shape[1]),
        "batch_slots": int(cohort["mask"].shape[2]),
        "engine": {"strategy": choice.strategy, "unroll": choice.unroll, "conv": choice.conv_impl},
        "upload_bytes": runner.upload_bytes(
            state, 4 * sum(x.size for x in jax.tree_util.tree_leaves(state.params))
        ),
    }


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--config", default="fedavg_femnist", help="a shipped config name or a config file"
    )
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="")
    args = p.parse_args()
    base = configs.get(args.config)
    dataset = build_dataset(base.data, base.seed)
    result = {
        "benchmark": "round_split",
        "config": args.config,
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "backend": jax.default_backend(),
        "device": str(jax.local_devices()[0].device_kind),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "variants": {},
    }
    for name in args.variants:
        cfg = configs.get(args.config, VARIANTS[name])
        row = split_round(cfg, dataset, args.repeats)
        result["variants"][name] = row
        print(
            f"{name:6s} round {row['round_s']:7.3f} s  "
            + "  ".join(f"{stage} {s['median_s']:.3f}" for stage, s in row["stages"].items()),
            flush=True,
        )
    rows = result["variants"]
    for extra, reference, label in (("dp", "plain", "privacy"), ("dp+cs", "dp", "compression")):
        if extra in rows and reference in rows:
            result[f"{label}_cost"] = {
                stage: (
                    rows[extra]["stages"][stage]["median_s"]
                    - rows[reference]["stages"].get(stage, {"median_s": 0.0})["median_s"]
                )
                for stage in rows[extra]["stages"]
            }
    if args.out:
        write_json(args.out, result, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k.endswith("_cost")}, indent=1))


if __name__ == "__main__":
    main()
