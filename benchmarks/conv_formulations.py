"""One 5x5 SAME convolution layer three ways on this backend: XLA's convolution, im2col (patches @
kernel) and space-to-depth (XLA's convolution of 2x2 blocks, ``models/conv.py``), forward and
forward + backward, outside loops, at the layer shapes of the repository's CNNs (issues 17 and 20).
The formulations are timed interleaved, round after round, so a loaded machine slows all alike; each
time is the best mean of back-to-back calls.

    python benchmarks/conv_formulations.py --out benchmarks/out/conv_formulations.json

A first layer (the data's channels) needs only the kernel's gradient; later layers the input's too.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from timing import best_ms  # noqa: E402

from fedjax_dp.models.conv import conv2d_im2col, conv2d_space_to_depth  # noqa: E402
from fedjax_dp.training.results import write_json  # noqa: E402

# (batch, side, cin, cout, first layer): cnn_pfl's two layers in training (B = 50) and in evaluation
# (batches of
# 500), the FedAvg CNN's (workload W: 10 examples a step; 100), and im2col_suits' measured shapes
SHAPES = [
    (50, 32, 3, 16, True),
    (500, 32, 3, 16, True),
    (50, 16, 16, 16, False),
    (500, 16, 16, 16, False),
    (10, 28, 1, 32, True),
    (100, 28, 1, 32, True),
    (10, 14, 32, 64, False),
    (100, 14, 32, 64, False),
    (50, 32, 3, 64, True),
    (10, 32, 3, 16, True),
    (50, 16, 16, 32, False),
    (50, 16, 64, 64, False),
    (50, 32, 3, 32, True),
    (500, 32, 3, 32, True),
    (50, 28, 1, 32, True),
    (500, 28, 1, 32, True),
    (50, 32, 1, 16, True),
    (500, 32, 1, 16, True),
]


def xla_conv(x, kernel):
    return jax.lax.conv_general_dilated(
        x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


FORMULATIONS = {"xla": xla_conv, "im2col": conv2d_im2col, "space_to_depth": conv2d_space_to_depth}


def programs(conv, first: bool):
    forward = jax.jit(conv)
    loss = lambda kernel, x: jnp.sum(jnp.tanh(conv(x, kernel)))  # noqa: E731
    backward = jax.jit(jax.grad(loss, argnums=0 if first else (0, 1)))
    return forward, backward


def measure(shape, rounds: int, calls: int) -> dict:
    batch, side, cin, cout, first = shape
    x = jax.random.normal(jax.random.key(0), (batch, side, side, cin))
    kernel = jax.random.normal(jax.random.key(1), (5, 5, cin, cout)) * 0.1
    built = {name: programs(conv, first) for name, conv in FORMULATIONS.items()}
    best = {
        name: {"forward_ms": float("inf"), "forward_backward_ms": float("inf")}
        for name in FORMULATIONS
    }
    for _ in range(rounds):  # interleaved
        for name, (forward, backward) in built.items():
            best[name]["forward_ms"] = min(
                best[name]["forward_ms"], best_ms(forward, x, kernel, calls=calls, repeats=1)
            )
            best[name]["forward_backward_ms"] = min(
                best[name]["forward_backward_ms"],
                best_ms(backward, kernel, x, calls=calls, repeats=1),
            )
    row = {"batch": batch, "side": side, "cin": cin, "cout": cout, "first_layer": first, "ms": best}
    for part in ("forward_ms", "forward_backward_ms"):
        row[f"fastest_{part[:-3]}"] = min(best, key=lambda name: best[name][part])
    return row


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--only", type=int, nargs="*", default=None, help="indices into SHAPES")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for shape in [SHAPES[i] for i in args.only] if args.only is not None else SHAPES:
        rows.append(measure(shape, args.rounds, args.calls))
        cells = " | ".join(
            f"{name} {v['forward_ms']:.2f} / {v['forward_backward_ms']:.2f}"
            for name, v in rows[-1]["ms"].items()
        )
        print(f"{shape}: ms forward / forward+backward: {cells}", flush=True)
    if args.out:
        write_json(
            args.out,
            {
                "benchmark": "conv_formulations",
                "backend": jax.default_backend(),
                "devices": str(jax.devices()),
                "rows": rows,
            },
        )


if __name__ == "__main__":
    main()
