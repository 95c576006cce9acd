"""How far a last-bit difference travels in CUAG-PFL's local training: the check behind "the CPU
engines compute the same function" (experiments/RESULTS.md, Table 8 / Table 3 on CIFAR-100 ALID3).

Part 1 (``--steps``): one client of the seed-004 setting (``cnn_pfl``, CIFAR-100 ALID3 unless told
otherwise) trains S steps of SGD at the paper's beta = 0.1 on batches of 2B = 100 from one
initialisation three ways: im2col convolutions, XLA's convolution (``per_layer`` picks it for both
layers of ``cnn_pfl``), and im2col from the initialisation scaled by (1 + 1e-7). It reports, after
each S, the relative parameter distance of the last two to the first and the mean training loss of
each. Equal growth of the two distances means the dynamics, not the convolution, decide how far runs
drift apart.

Part 2 (``--rounds-check``): round 1 of the Table 8 paper-mode run (``experiments/seed004_tables.py
--table 8``) on each CPU engine, its ``train_loss`` and personalised accuracy side by side: engines
whose convolutions are the same XLA program give the same bits; the others differ from round 1.

    python experiments/local_training_sensitivity.py --out results/local_training_sensitivity.json
    --rounds-check
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.core import tree
from fedjax_dp.data.builders import build_dataset
from fedjax_dp.models import get_model
from fedjax_dp.training.results import write_json

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from provenance import stamped  # noqa: E402

from seed004_tables import configure, split_overrides  # noqa: E402

# (strategy, unroll, conv_impl): the scan engine used before 2026-11-26, three bit-identical
# relatives of it,
# and the loop-free engine `auto` picks on a CPU now.
ENGINES = (
    ("sequential", "1", "im2col"),
    ("sequential", "full", "im2col"),
    ("loop", "full", "im2col"),
    ("loop", "full", "per_layer"),
)


def client_data(source: str, split: str, seed: int, client: int):
    args = SimpleNamespace(rounds=1, eval_every=1, seed=seed, source=source, data_dir="")
    # the seed-004 tables' data
    dataset = build_dataset(configure(args, split_overrides(split)).data, seed)
    index = dataset.client_train[client]
    return dataset, jnp.asarray(dataset.x[index]), jnp.asarray(dataset.y[index])


def train(
    dataset, x, y, conv_impl: str, steps: int, perturbation: float, seed: int, lr: float, batch: int
):
    """``steps`` SGD steps of softmax cross-entropy from ``model.init(key(seed))`` scaled by ``1 +
    perturbation``; the batches are the same for every call."""
    model = get_model("cnn_pfl", dataset.example_shape, dataset.num_classes, conv_impl=conv_impl)
    params = jax.tree_util.tree_map(
        lambda p: p * (1 + perturbation), model.init(jax.random.key(seed))
    )
    optimizer = optax.sgd(lr)

    def loss(p, xb, yb):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, xb), yb).mean()

    @jax.jit
    def step(p, state, xb, yb):
        value, grads = jax.value_and_grad(loss)(p, xb, yb)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    state, losses, rng = optimizer.init(params), [], np.random.default_rng(seed)
    for _ in range(steps):
        b = rng.choice(len(y), batch, replace=False)
        params, state, value = step(params, state, x[b], y[b])
        losses.append(float(value))
    return params, float(np.mean(losses))


def relative_distance(a, b) -> float:
    return float(tree.l2_norm(jax.tree_util.tree_map(jnp.subtract, a, b)) / tree.l2_norm(a))


def local_steps_part(args) -> list[dict]:
    dataset, x, y = client_data(args.source, args.split, args.seed, args.client)
    rows = []
    for steps in args.steps:
        run = lambda impl, eps=0.0: train(
            dataset, x, y, impl, steps, eps, args.seed, args.lr, args.batch
        )  # noqa: E731
        (reference, loss_ref), (xla, loss_xla), (nudged, loss_nudged) = (
            run("im2col"),
            run("xla"),
            run("im2col", 1e-7),
        )
        rows.append(
            {
                "steps": steps,
                "distance_xla_conv": relative_distance(reference, xla),
                "distance_init_times_1_plus_1e-7": relative_distance(reference, nudged),
                "mean_loss_im2col": loss_ref,
                "mean_loss_xla_conv": loss_xla,
                "mean_loss_nudged": loss_nudged,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def round_one_part(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for strategy, unroll, conv in ENGINES:
            out = os.path.join(tmp, f"{strategy}_{unroll}_{conv}")
            data_dir = [] if args.source == "cifar10" else ["--source", args.source]
            subprocess.run(
                [
                    sys.executable,
                    os.path.join(HERE, "seed004_tables.py"),
                    "--table",
                    "8",
                    "--only",
                    "paper mode, mu_n in [0.1, 4]",
                    "--splits",
                    args.split,
                    *data_dir,
                    "--rounds",
                    "1",
                    "--eval-every",
                    "1",
                    "--seed",
                    str(args.seed),
                    "--out",
                    out,
                    "--set",
                    f"engine.strategy={strategy}",
                    f"engine.unroll={unroll}",
                    f"engine.conv_impl={conv}",
                ],
                check=True,
                capture_output=True,
            )
            metrics = [
                json.loads(line)
                for line in open(glob.glob(os.path.join(out, "*", "metrics.jsonl"))[0])
            ]
            first = next(m for m in metrics if m.get("round") == 1)
            rows.append(
                {
                    "strategy": strategy,
                    "unroll": unroll,
                    "conv_impl": conv,
                    "train_loss_round_1": first["train_loss"],
                    "personalized_accuracy_round_1": first["personalized_accuracy"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--source", default="cifar100", choices=["cifar10", "cifar100"])
    p.add_argument("--split", default="alid3")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--client", type=int, default=0)
    p.add_argument("--steps", type=int, nargs="+", default=[1, 5, 25])
    p.add_argument("--lr", type=float, default=0.1, help="the seed's beta")
    p.add_argument("--batch", type=int, default=100, help="2B: PFLDyn's two batches of 50")
    p.add_argument("--rounds-check", action="store_true", help="also run part 2 (about 4 x 50 s)")
    p.add_argument("--out", default="results/local_training_sensitivity.json")
    args = p.parse_args()
    report = {
        "backend": jax.default_backend(),
        "source": args.source,
        "split": args.split,
        "seed": args.seed,
        "client": args.client,
        "lr": args.lr,
        "batch": args.batch,
        "local_steps": local_steps_part(args),
    }
    if args.rounds_check:
        report["round_one"] = round_one_part(args)
    write_json(args.out, stamped(report), indent=2)


if __name__ == "__main__":
    main()
