"""Does a model train under PFLDyn(Proto)'s prototype loss at a given learning rate? A cheap central
probe (seed 004 Eq. 12's f_n(T_n(w, D), D') without the regulariser or FL): plain SGD on three
CIFAR-10 classes, prototypes from a batch D of B = 50, cross-entropy on a second batch D' of 50, as
one client's local step.

It chose the learning rates of the VGG16 rows of Table 6 (experiments/RESULTS.md, "Table 6 with
VGG16"): a net that dies here (gradient norm collapsing, accuracy falling to chance) does not train
in FL either. Prints, every ``--every`` steps, the prototype accuracy of one fixed held-out pair of
batches, the step's loss and its gradient norm; ``--out`` writes them as JSON.

    python experiments/prototype_lr_probe.py --model vgg16_gn --learning-rate 0.03 --steps 30 \\
        --data-dir ../shared/data/cifar10
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.core.prototypes import prototype_correct, prototype_loss
from fedjax_dp.models import get_model
from provenance import stamped

BATCH = 50


def probe(
    x: np.ndarray,
    y: np.ndarray,
    model_name: str,
    learning_rate: float,
    steps: int,
    every: int = 10,
    num_classes: int = 10,
    seed: int = 0,
) -> list[dict]:
    """Rows ``{step, accuracy, loss, grad_norm, seconds}``; ``x`` float images in [0, 1], ``y`` int
    labels."""
    model = get_model(model_name, x.shape[1:], num_classes, conv_impl="xla")
    params = model.init(jax.random.key(seed))
    real = jnp.ones(BATCH, bool)

    def loss_fn(p, xs, ys, xq, yq):
        return prototype_loss(
            model.apply(p, xs), ys, real, model.apply(p, xq), yq, real, num_classes
        )

    @jax.jit
    def step(p, xs, ys, xq, yq):
        loss, grads = jax.value_and_grad(loss_fn)(p, xs, ys, xq, yq)
        return (
            jax.tree_util.tree_map(lambda w, g: w - learning_rate * g, p, grads),
            loss,
            optax.global_norm(grads),
        )

    @jax.jit
    def accuracy(p, xs, ys, xq, yq):
        return jnp.mean(
            prototype_correct(model.apply(p, xs), ys, real, model.apply(p, xq), yq, num_classes)
        )

    rng = np.random.default_rng(seed)
    held_out = rng.choice(len(x), 2 * BATCH, replace=False)
    pair = lambda i: (x[i[:BATCH]], y[i[:BATCH]], x[i[BATCH:]], y[i[BATCH:]])  # noqa: E731
    rows, start = [], time.perf_counter()
    for s in range(steps + 1):
        row = (
            {"step": s, "accuracy": float(accuracy(params, *pair(held_out)))}
            if s % every == 0
            else None
        )
        params, loss, grad_norm = step(params, *pair(rng.choice(len(x), 2 * BATCH, replace=False)))
        if row is not None:
            row.update(
                loss=float(loss),
                grad_norm=float(grad_norm),
                seconds=round(time.perf_counter() - start, 1),
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def three_classes(
    data_dir: str, classes=(0, 1, 2), limit: int = 6000
) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 training images of ``classes`` (the first ``limit``), scaled to [0, 1]."""
    from fedjax_dp.data.cifar_files import load_cifar_uint8

    data = load_cifar_uint8(data_dir)
    keep = np.isin(data["y_train"], classes)
    return (
        data["x_train"][keep][:limit].astype(np.float32) / 255.0,
        data["y_train"][keep][:limit].astype(np.int32),
    )


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="vgg16")
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--every", type=int, default=10)
    p.add_argument(
        "--data-dir", required=True, help="the CIFAR-10 files (../shared/data/cifar10 here)"
    )
    p.add_argument("--out", default="", help="write the rows as JSON here")
    args = p.parse_args(argv)
    if args.learning_rate <= 0 or args.steps < 1 or args.every < 1:
        p.error(
            f"--learning-rate must be > 0 and --steps, --every >= 1, got {args.learning_rate}, "
            f"{args.steps}, {args.every}"
        )
    x, y = three_classes(args.data_dir)
    rows = probe(x, y, args.model, args.learning_rate, args.steps, args.every)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                stamped({"model": args.model, "learning_rate": args.learning_rate, "rows": rows}),
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
