"""Per-example clipped gradient sums without per-example dense-layer gradients ("book-keeping"
clipping).

DP-SGD (Abadi et al. 2016, Alg. 1) needs sum_i g_i / max(1, ||g_i|| / C) over a batch. Vmapping
``jax.grad`` over the examples writes every example's whole gradient: for a dense layer y = a K + b
that is B outer products a_i^T g_i of the kernel's size (B x 3136 x 512 floats for the FedAvg CNN's
first dense layer, ~90 % of its DP-SGD step). For a dense layer the norm and the clipped sum need
none of them (Goodfellow 2015; Li et al. 2022, "ghost clipping"; Bu et al. 2023, "book-keeping"):
with a_i the layer's input and g_i = dL_i/dy_i its output gradient,

    ||grad_K L_i||^2 = ||a_i||^2 ||g_i||^2                      (one position per example)
                     = sum_{t,s} (a_i a_i^T)_{ts} (g_i g_i^T)_{ts}  (positions t, s: a sequence
                     model)
    sum_i c_i grad_K L_i = (c * a)^T g                          (one matmul)

One vmapped backward pass gives every example's g_i (the gradient of a zero added to the layer's
output) and the per-example gradients of the other parameters (convolutions, recurrent cells), which
are small; the dense layers' inputs come back as auxiliary outputs. The numbers are those of the
vmapped per-example gradients up to floating-point summation order (tests/test_ghost_clipping.py).

Which layers: a flax ``nn.Dense`` that is a direct child of the model's root module, is called once
per example (found by an abstract trace), and whose kernel and bias reach the loss through that call
only. A parameter read anywhere else too (weight tying through ``variables``, as tied input and
output embeddings do) would get only its dense call's share of the gradient, so norms too small and
clips too weak (measured: 1.16 C contributions, a clipped sum 71 % off): the loss's jaxpr is
searched for every read of each leaf (``_reads``) and a layer read elsewhere keeps per-example
gradients. Any other parameter, or a loss with no such layer, gets its per-example gradients as
before.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from fedjax_dp.privacy.mechanisms.clipping import example_clip_weights


@dataclasses.dataclass(frozen=True)
class DenseCall:
    """A dense layer found by the abstract trace: its parameter path and its output's shape on one
    example."""

    path: tuple[str, ...]
    output_shape: tuple[int, ...]


def find_dense_calls(per_example_loss, params, example, key) -> tuple[DenseCall, ...]:
    """The root-level ``nn.Dense`` layers that ``per_example_loss`` calls exactly once on one
    example (an abstract trace: nothing is computed). Layers called twice, or nested in another
    module, are left out."""
    seen: list[DenseCall] = []

    def record(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if (
            isinstance(context.module, nn.Dense)
            and context.method_name == "__call__"
            and len(context.module.path) == 1
        ):
            seen.append(DenseCall(tuple(context.module.path), tuple(out.shape)))
        return out

    with nn.intercept_methods(record):
        jax.eval_shape(lambda p: per_example_loss(p, example, key), params)
    paths = [call.path for call in seen]
    flat = traverse_util.flatten_dict(params)
    once = [
        call for call in seen if paths.count(call.path) == 1 and call.path + ("kernel",) in flat
    ]
    if not once:
        return ()
    names = list(flat)
    traced = jax.make_jaxpr(
        lambda leaves: per_example_loss(
            traverse_util.unflatten_dict(dict(zip(names, leaves))), example, key
        )
    )(list(flat.values())).jaxpr
    reads = dict(zip(names, (_reads(traced, var) for var in traced.invars)))
    return tuple(
        call
        for call in once
        if all(reads.get(call.path + (leaf,), 1) == 1 for leaf in ("kernel", "bias"))
    )


UNKNOWN_READS = 2
"""What ``_reads`` counts for a variable passed into a higher-order primitive whose operands it
cannot map to its body's (a while loop's split constants, say): more than one, so the layer keeps
per-example gradients."""


def _reads(jaxpr, var) -> int:
    """How many operations of ``jaxpr`` read ``var``, looking through calls, scans and conds into
    their bodies (a dense call reads its kernel once: its dot, or the dtype conversion before
    it)."""
    count = sum(out is var for out in jaxpr.outvars)
    for eqn in jaxpr.eqns:
        for position, operand in enumerate(eqn.invars):
            if operand is not var:
                continue
            bodies = [
                v.jaxpr if hasattr(v, "jaxpr") else v
                for v in eqn.params.values()
                if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")
            ]
            bodies += [b.jaxpr for b in eqn.params.get("branches", ())]
            if not bodies:
                count += 1
            elif eqn.primitive.name == "cond":  # branches take the operands after the index
                count += (
                    max(_reads(b, b.invars[position - 1]) for b in bodies)
                    if position
                    else UNKNOWN_READS
                )
            elif all(len(b.invars) == len(eqn.invars) for b in bodies):
                count += max(_reads(b, b.invars[position]) for b in bodies)
            else:
                count += UNKNOWN_READS
    return count


def clipped_gradient_sum(
    per_example_loss, params, batch, mask, key, clip_norm, median: bool = False
):
    """``(losses, summed, C)``: each example's loss, sum_i mask_i g_i / max(1, ||g_i|| / C) and the
    C used (``clip_norm``, or with ``median`` the median of the real examples' gradient norms), g_i
    the gradient of example i's loss; dense layers by book-keeping (module docstring), the rest per
    example."""
    single = jax.tree_util.tree_map(lambda x: x[:1], batch)
    calls = find_dense_calls(per_example_loss, params, single, key)
    flat = traverse_util.flatten_dict(params)
    dense_keys = {
        call.path + (leaf,)
        for call in calls
        for leaf in ("kernel", "bias")
        if call.path + (leaf,) in flat
    }
    dense = {k: v for k, v in flat.items() if k in dense_keys}
    others = {k: v for k, v in flat.items() if k not in dense_keys}
    by_path = {call.path: i for i, call in enumerate(calls)}

    def one_example(other_params, nudges, example):
        """Example i's loss, its gradient in the other parameters and in a zero added to each dense
        output."""

        def loss(other_params, nudges):
            inputs = [None] * len(calls)

            def nudge(next_fun, args, kwargs, context):
                out = next_fun(*args, **kwargs)
                index = (
                    by_path.get(tuple(context.module.path))
                    if isinstance(context.module, nn.Dense)
                    else None
                )
                if index is None or context.method_name != "__call__":
                    return out
                inputs[index] = args[0]
                return out + nudges[index].astype(out.dtype)

            merged = traverse_util.unflatten_dict({**dense, **other_params})
            with nn.intercept_methods(nudge):
                value = per_example_loss(
                    merged, jax.tree_util.tree_map(lambda x: x[None], example), key
                )[0]
            return value, tuple(inputs)

        return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(other_params, nudges)

    zeros = tuple(jnp.zeros(call.output_shape, jnp.float32) for call in calls)
    (losses, dense_inputs), (other_grads, output_grads) = jax.vmap(
        one_example, in_axes=(None, None, 0)
    )(others, zeros, batch)
    dense_inputs = [
        a.astype(jnp.float32).reshape(a.shape[0], -1, a.shape[-1]) for a in dense_inputs
    ]
    output_grads = [g.reshape(g.shape[0], -1, g.shape[-1]) for g in output_grads]

    squared = sum(
        (jnp.sum(jnp.square(g).reshape(g.shape[0], -1), axis=1) for g in other_grads.values()),
        jnp.zeros(mask.shape[0], jnp.float32),
    )
    for call, a, g in zip(calls, dense_inputs, output_grads):
        squared = squared + _kernel_norm_squared(a, g)
        if call.path + ("bias",) in dense_keys:
            squared = squared + jnp.sum(jnp.square(jnp.sum(g, axis=1)), axis=1)
    weights, clip_norm = example_clip_weights(jnp.sqrt(squared), mask, clip_norm, median)

    summed = {k: jnp.tensordot(weights.astype(g.dtype), g, axes=1) for k, g in other_grads.items()}
    for call, a, g in zip(calls, dense_inputs, output_grads):
        weighted = g * weights[:, None, None]
        summed[call.path + ("kernel",)] = jnp.einsum("bti,bto->io", a, weighted).astype(
            flat[call.path + ("kernel",)].dtype
        )
        if call.path + ("bias",) in dense_keys:
            summed[call.path + ("bias",)] = jnp.sum(weighted, axis=(0, 1)).astype(
                flat[call.path + ("bias",)].dtype
            )
    return losses, traverse_util.unflatten_dict(summed), clip_norm


def _kernel_norm_squared(a, g):
    """||a_i^T g_i||_F^2 for every example i of ``a`` (B, T, in) and ``g`` (B, T, out), by the
    cheaper of the two forms: ||a_i||^2 ||g_i||^2 at T = 1, the T x T Gram matrices where T^2 < in x
    out, else the product."""
    positions, width_in, width_out = a.shape[1], a.shape[2], g.shape[2]
    if positions == 1:
        return jnp.sum(jnp.square(a[:, 0]), axis=1) * jnp.sum(jnp.square(g[:, 0]), axis=1)
    if positions * positions < width_in * width_out:
        return jnp.sum(
            jnp.einsum("bti,bsi->bts", a, a) * jnp.einsum("bto,bso->bts", g, g), axis=(1, 2)
        )
    return jnp.sum(jnp.square(jnp.einsum("bti,bto->bio", a, g)), axis=(1, 2))
