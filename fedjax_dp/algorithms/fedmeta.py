"""FedMeta: controllable meta updating on the server (seed 002 §3.2, Alg. 2, Eq. 20; ALGORITHMS.md §2).

After any base algorithm aggregates round t into w_{t+1}, the server takes meta step(s) on a small
server-held set D_meta (about 1 % of the data; ``data.server_sets``):

    w^meta_{t+1} = w_{t+1} - eta_meta grad_w L(w_{t+1}; D_meta)                                  (20)

FedMeta wraps the base (FedAvg, FedProx, UGA: "FedMeta w/ UGA", DP-FedAvg) by composition. The meta
step reads only server-held data, so under DP it is post-processing of the privatised aggregate and
costs no client privacy; D_meta itself is not protected by the client-level guarantee (it is data the
server holds, e.g. volunteered), which the privacy report states.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.core import rng, tree
from fedjax_dp.core.local_training import make_data_value_and_grad

META_DATA_NOTE = ("FedMeta's server meta step uses only the server-held set D_meta: post-processing of the "
                  "private aggregate, no client privacy spent; D_meta itself is not covered by the guarantee.")


def meta_batches(x: np.ndarray, y: np.ndarray, batch_size: int = 0) -> tuple[dict, np.ndarray]:
    """D_meta as ``(batches (S, B, ...), mask (S, B))`` covering every example once; ``batch_size`` 0
    puts it in one batch."""
    n = len(y)
    if n == 0:
        raise ValueError("D_meta is empty: FedMeta needs at least one server-held example")
    if len(x) != n:
        raise ValueError(f"D_meta has {len(x)} inputs but {n} labels")
    if batch_size < 0:
        raise ValueError(f"meta batch size must be >= 0 (0 = all of D_meta), got {batch_size}")
    b = batch_size or n
    steps = math.ceil(n / b)
    idx = np.arange(steps * b)
    mask = (idx < n).reshape(steps, b)
    idx = np.minimum(idx, n - 1).reshape(steps, b)
    return {"x": x[idx], "y": np.asarray(y)[idx].astype(np.int32)}, mask


@dataclasses.dataclass(frozen=True)
class FedMeta:
    """``base`` followed by ``meta_steps`` gradient steps on D_meta with rate ``meta_learning_rate``
    (times ``meta_lr_decay ** t``). Each step uses the full D_meta loss (Eq. 20), evaluated in
    batches of ``meta_batch_size`` (0 = one batch) to bound memory."""

    base: Any
    per_example_loss: Any
    meta_x: np.ndarray
    meta_y: np.ndarray
    meta_learning_rate: float
    meta_steps: int = 1
    meta_lr_decay: float = 1.0
    meta_batch_size: int = 0

    def __post_init__(self):
        if not self.meta_learning_rate > 0:
            raise ValueError(f"FedMeta eta_meta must be > 0, got {self.meta_learning_rate}")
        if self.meta_steps < 1:
            raise ValueError(f"FedMeta needs meta_steps >= 1, got {self.meta_steps}")
        if not 0 < self.meta_lr_decay <= 1:
            raise ValueError(f"meta learning-rate decay must lie in (0, 1], got {self.meta_lr_decay}")
        batches, mask = meta_batches(self.meta_x, self.meta_y, self.meta_batch_size)
        value_and_grad = make_data_value_and_grad(self.per_example_loss)
        object.__setattr__(self, "_meta_data", (jax.device_put(batches), jax.device_put(mask)))
        object.__setattr__(self, "_meta_update", jax.jit(lambda p, b, m, r, k: meta_update(
            value_and_grad, p, b, m, r, k, self.meta_learning_rate, self.meta_lr_decay, self.meta_steps)))

    @property
    def needs_evaluation_pass(self) -> bool:
        return self.base.needs_evaluation_pass

    def __getattr__(self, name):  # private, sensitivity, update_noise_multiplier, ... of the base
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.base, name)

    def init(self, params):
        return self.base.init(params)

    def round(self, state, cohort, key: jax.Array, *args):
        """The base round, then the meta step(s); metrics gain ``meta_loss`` (D_meta loss before)."""
        state, metrics = self.base.round(state, cohort, key, *args)
        batches, mask = self._meta_data
        params, meta_loss, ok = self._meta_update(state.params, batches, mask, state.round - 1,
                                                  rng.purpose_key(key, rng.Purpose.SERVER_META))
        return state.replace(params=params), {**metrics, "meta_loss": meta_loss, "meta_step_skipped": ~ok}


def meta_update(value_and_grad, params, batches, mask, round_index, key, learning_rate, decay, steps):
    """``steps`` SGD steps on the D_meta loss; returns ``(params, loss before, ok)``. A step whose
    gradient is not finite is not applied (``ok`` False), so the meta step cannot corrupt the model."""
    lr = learning_rate * jnp.power(jnp.float32(decay), round_index.astype(jnp.float32))
    grad_fn = functools.partial(value_and_grad, batches=batches, mask=mask, key=key)

    def step(carry, _):
        p, all_ok = carry
        loss, grads = grad_fn(p)
        ok = tree.is_finite(grads) & jnp.isfinite(loss)
        stepped = optax.apply_updates(p, jax.tree_util.tree_map(lambda g: -lr * g, grads))
        return (tree.where(ok, stepped, p), all_ok & ok), loss

    (params, ok), losses = jax.lax.scan(step, (params, jnp.array(True)), None, length=steps)
    return params, losses[0], ok
