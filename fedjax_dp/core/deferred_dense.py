"""Plain-SGD local training that leaves large dense kernels unwritten until the client's last step.

With SGD at rate eta_s, local step s changes a dense kernel W (in x out) by -eta_s X_s^T G_s, where
X_s (rows x in) is the layer's input in step s and G_s = dL/dZ_s (rows x out) the loss's gradient at
its output Z_s = X_s W_s + b. After s steps W_s = W_0 - X_<s^T (eta G)_<s, the stacked history of
the earlier steps, so

    Z_s = X_s W_0 - (X_s X_<s^T) (eta G)_<s + b,    and the client's final kernel is W_0 - X_hist^T
    (eta G)_hist:

the same function, computed from the unchanged W_0 (McMahan et al. 2017's ClientUpdate; the low-rank
structure of per-batch dense gradients as in Goodfellow 2015's per-example-gradient trick). When the
history is short against the kernel (S steps x rows <= min(in, out) / 4: workload W's FedAvg CNN has
60 rows against 3136 x 512), this replaces, every step, writing the kernel's gradient and reading
and writing the kernel to update it (memory-bound passes over 6.4 MB on a CPU) by products with the
60-row history, and one product at the end. Measured in ``benchmarks/RESULTS.md``.

Only for plain SGD at a constant rate (no momentum, weight decay or gradient clipping: those make
the step's change full-rank), without a regularizer or gradient hook, and only for
``flax.linen.Dense`` layers called once per forward pass with the default ``dot_general``. Results
equal ``make_local_trainer``'s with ``optax.sgd`` up to float rounding (the products are grouped
differently).
"""

from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from fedjax_dp.core.local_training import (
    PerExampleLoss,
    local_stats,
    masked_mean,
    skips_padded_steps,
)

# engine.deferred_dense: auto = on CPU and GPU backends (where it was measured)
DEFERRED_DENSE_MODES = ("auto", "on", "off")
# where ``auto`` turns it on (measured faster there: benchmarks/RESULTS.md)
MEASURED_BACKENDS = ("cpu", "gpu")
HISTORY_FRACTION = 4  # defer a kernel while steps x rows <= min(in, out) / HISTORY_FRACTION


def on_by_default() -> bool:
    """What ``engine.deferred_dense='auto'`` means: on where the backend is one it was measured
    faster on (the CPU and an NVIDIA GPU, ``benchmarks/RESULTS.md``). Off elsewhere (TPU: not
    measured)."""
    return jax.default_backend() in MEASURED_BACKENDS


def _kernel_path(module: nn.Module, paths) -> tuple:
    """The parameter-tree path of a dense module's kernel: with or without flax's ``params`` level,
    whichever the loss's parameters have (``models.Model`` adds it inside ``apply``)."""
    path = tuple(module.scope.path) + ("kernel",)
    return path if path in paths else ("params",) + path


def _dense_calls(per_example_loss: PerExampleLoss, params, batch, key, paths) -> dict:
    """Every ``nn.Dense`` call of one forward pass: kernel path (in ``paths``, the flat parameter
    tree's keys) -> (calls, input rows, plain)."""
    calls: dict = {}

    def record(next_fun, args, kwargs, context):
        module = context.module
        if isinstance(module, nn.Dense) and context.method_name == "__call__":
            path = _kernel_path(module, paths)
            rows = 1
            for d in args[0].shape[:-1]:
                rows *= d
            plain = (
                module.dot_general is None
                and module.dot_general_cls is None
                and module.dtype is None
            )
            count = calls.get(path, (0,))[0]
            calls[path] = (count + 1, rows, plain)
        return next_fun(*args, **kwargs)

    def forward(params, batch):
        with nn.intercept_methods(record):
            return per_example_loss(params, batch, key)

    jax.eval_shape(forward, params, batch)
    return calls


def deferrable_kernels(per_example_loss: PerExampleLoss, params, batches, key) -> dict[tuple, int]:
    """The dense kernels worth deferring for clients of ``batches`` (leading steps axis): path ->
    rows a step. Empty when none qualifies (then use ``make_local_trainer``)."""
    steps = jax.tree_util.tree_leaves(batches)[0].shape[0]
    one_step = jax.tree_util.tree_map(lambda x: x[0], batches)
    flat = traverse_util.flatten_dict(params) if isinstance(params, Mapping) else {}
    chosen = {}
    for path, (count, rows, plain) in _dense_calls(
        per_example_loss, params, one_step, key, flat
    ).items():
        kernel = flat.get(path)
        if (
            count == 1
            and plain
            and kernel is not None
            and kernel.ndim == 2
            and (steps * rows * HISTORY_FRACTION <= min(kernel.shape))
        ):
            chosen[path] = rows
    return chosen


def make_deferred_dense_sgd_trainer(
    per_example_loss: PerExampleLoss,
    learning_rate: float,
    deferred: Mapping[tuple, int],
    *,
    unroll: int | bool = 1,
):
    """``train(params, batches, mask, key, lr_scale=1.0) -> (params, LocalStats)``, as
    ``make_local_trainer(per_example_loss, optax.sgd(learning_rate), unroll=unroll)`` computes it,
    with the kernels of ``deferred`` (path -> rows a step, from ``deferrable_kernels``) updated
    once, at the end. A step whose batch is all padding changes nothing."""
    if not learning_rate > 0:
        raise ValueError(f"learning rate must be > 0, got {learning_rate}")
    paths = tuple(deferred)

    def train(params, batches, mask, key, lr_scale=1.0):
        flat = traverse_util.flatten_dict(params)
        kernels = {p: flat[p] for p in paths}
        free = {p: v for p, v in flat.items() if p not in kernels}
        steps = mask.shape[0]
        history = {
            p: (
                jnp.zeros((steps * deferred[p], w.shape[0]), w.dtype),
                jnp.zeros((steps * deferred[p], w.shape[1]), w.dtype),
            )
            for p, w in kernels.items()
        }
        step_of = lambda g: (-learning_rate * g) * lr_scale  # noqa: E731  (optax.sgd's update, then lr_scale)

        def step_loss(free, probes, history, batch, batch_mask, step_key):
            inputs = {}

            def deferred_dense(next_fun, args, kwargs, context):
                module = context.module
                if not (isinstance(module, nn.Dense) and context.method_name == "__call__"):
                    return next_fun(*args, **kwargs)
                path = _kernel_path(module, kernels)
                if path not in kernels:
                    return next_fun(*args, **kwargs)
                x = args[0]
                rows = x.reshape(-1, x.shape[-1])
                past_inputs, past_steps = history[path]
                z = rows @ kernels[path] + (rows @ past_inputs.T) @ past_steps + probes[path]
                if module.use_bias:
                    z = z + module.variables["params"]["bias"]
                inputs[path] = rows
                return z.reshape(x.shape[:-1] + (z.shape[-1],))

            with nn.intercept_methods(deferred_dense):
                losses = per_example_loss(
                    traverse_util.unflatten_dict({**free, **kernels}), batch, step_key
                )
            return masked_mean(losses, batch_mask), inputs

        def take_step(carry, batch, batch_mask, step_key, index):
            free, history = carry
            probes = {p: jnp.zeros((deferred[p], w.shape[1]), w.dtype) for p, w in kernels.items()}
            (loss, inputs), (grads, output_grads) = jax.value_and_grad(
                step_loss, argnums=(0, 1), has_aux=True
            )(free, probes, history, batch, batch_mask, step_key)
            free = {p: v + step_of(grads[p]) for p, v in free.items()}

            def write(buffer, path, rows):  # this step's rows of the history
                return jax.lax.dynamic_update_slice_in_dim(buffer, rows, index * deferred[path], 0)

            history = {
                p: (
                    write(history[p][0], p, inputs[p]),
                    write(history[p][1], p, step_of(output_grads[p])),
                )
                for p in paths
            }
            return (free, history), loss

        def body(carry, xs):
            batch, batch_mask, step_key, index = xs
            real = jnp.any(batch_mask)
            step = lambda c: take_step(c, batch, batch_mask, step_key, index)  # noqa: E731
            new, loss = skips_padded_steps(step, carry, real)
            return new, (loss, jnp.sum(batch_mask), real)

        keys = jax.random.split(key, steps)
        (free, history), (losses, counts, real) = jax.lax.scan(
            body, (free, history), (batches, mask, keys, jnp.arange(steps)), unroll=unroll
        )
        trained = {p: w + history[p][0].T @ history[p][1] for p, w in kernels.items()}
        return traverse_util.unflatten_dict({**free, **trained}), local_stats(losses, counts, real)

    return train
