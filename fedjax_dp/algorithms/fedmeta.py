"""FedMeta: controllable meta updating on the server (seed 002 §3.2, Alg. 2, Eq. 20; ALGORITHMS.md
§2).

After any base algorithm aggregates round t into w_{t+1}, the server takes meta step(s) on a small
server-held set D_meta (about 1 % of the data; ``data.server_sets``):

    w^meta_{t+1} = w_{t+1} - eta_meta grad_w L(w_{t+1};
    D_meta)    (20)

``FedMeta`` wraps any algorithm of the protocol (FedAvg, FedProx, UGA: "FedMeta w/ UGA", SCAFFOLD,
and the DP variants through their upload chains): clients are the base's, the meta step follows the
base's server step. D_meta is server-held data: the meta step reads no client upload, but D_meta is
NOT covered by the client-level guarantee, and if it was drawn from the clients' own examples the
privacy report must say so (``data.server_sets``).
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

from fedjax_dp.algorithms import registry
from fedjax_dp.core import rng, tree
from fedjax_dp.core.algorithm import ClientOut, Requirements, ServerState
from fedjax_dp.core.local_training import make_data_value_and_grad


def meta_batches(x: np.ndarray, y: np.ndarray, batch_size: int = 0) -> tuple[dict, np.ndarray]:
    """D_meta as ``(batches (S, B, ...), mask (S, B))`` covering every example once; ``batch_size``
    0 puts it in one batch."""
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
    # the rest by keyword: a field added here cannot shift a builder's arguments
    _: dataclasses.KW_ONLY
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
            raise ValueError(
                f"meta learning-rate decay must lie in (0, 1], got {self.meta_lr_decay}"
            )
        meta_batches(self.meta_x, self.meta_y, self.meta_batch_size)  # validates D_meta now

    @property
    def requirements(self) -> Requirements:
        return dataclasses.replace(self.base.requirements, server_set=True)

    def init(self, params, key=None) -> ServerState:
        return self.base.init(params, key)

    def upload_template(self, params):
        return self.base.upload_template(params)

    def client_state_init(self, params):
        return self.base.client_state_init(params)

    def broadcast(self, state: ServerState):
        return self.base.broadcast(state)

    def client_update(self, shared, client, client_state, key) -> ClientOut:
        return self.base.client_update(shared, client, client_state, key)

    def server_update(self, state: ServerState, aggregate, key):
        """The base's server step, then the meta step(s); metrics gain ``meta_loss`` (D_meta loss
        before)."""
        state, metrics = self.base.server_update(state, aggregate, key)
        batches, mask = meta_batches(self.meta_x, self.meta_y, self.meta_batch_size)
        params, meta_loss, ok = meta_update(
            make_data_value_and_grad(self.per_example_loss),
            state.params,
            batches,
            mask,
            state.round - 1,
            rng.purpose_key(key, rng.Purpose.SERVER_META),
            self.meta_learning_rate,
            self.meta_lr_decay,
            self.meta_steps,
        )
        return state.replace(params=params), {
            **metrics,
            "meta_loss": meta_loss,
            "meta_step_skipped": ~ok,
        }


def meta_update(
    value_and_grad, params, batches, mask, round_index, key, learning_rate, decay, steps
):
    """``steps`` SGD steps on the D_meta loss; returns ``(params, loss before, ok)``. A step whose
    gradient is not finite is not applied (``ok`` False), so the meta step cannot corrupt the
    model."""
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


def wrap_fedmeta(ctx, algorithm, server_set) -> FedMeta:
    if server_set is None:
        raise ValueError("fedmeta.enabled needs a server-held set D_meta (server_data)")
    m = ctx.cfg.fedmeta
    return FedMeta(
        algorithm,
        ctx.model.per_example_loss,
        server_set.x,
        server_set.y,
        meta_learning_rate=m.learning_rate,
        meta_steps=m.steps,
        meta_lr_decay=m.lr_decay,
        meta_batch_size=m.batch_size,
    )


def check_fedmeta(cfg, need) -> None:
    m = cfg.fedmeta
    need(m.learning_rate > 0, f"fedmeta.learning_rate eta_meta must be > 0, got {m.learning_rate}")
    need(m.steps >= 1, f"fedmeta.steps must be >= 1, got {m.steps}")
    need(0 < m.lr_decay <= 1, f"fedmeta.lr_decay must lie in (0, 1], got {m.lr_decay}")
    need(m.batch_size >= 0, f"fedmeta.batch_size must be >= 0, got {m.batch_size}")


SECTION_DOCS = {  # what each key of the section means (``fedjax-dp --help``)
    "enabled": "FedMeta: meta step(s) on the server-held set D_meta after every aggregation",
    "learning_rate": "FedMeta: eta_meta",
    "steps": "FedMeta: meta steps per round",
    "lr_decay": "FedMeta: eta_meta x lr_decay**t",
    "batch_size": "FedMeta: meta batch size (0 = all of D_meta at once)",
}
registry.register_wrapper(
    "fedmeta",
    docs=SECTION_DOCS,
    defaults={
        "enabled": False,
        "learning_rate": 0.002,
        "steps": 1,
        "lr_decay": 1.0,
        "batch_size": 0,
    },
    wrap=wrap_fedmeta,
    validate=check_fedmeta,
    needs_server_set=True,
    privacy_note=(
        "FedMeta's server meta step uses only the server-held set D_meta, without noise: it reads"
        " no client upload, and the guarantee holds only if D_meta holds no protected client's data"
    ),
)
