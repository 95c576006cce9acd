"""What every algorithm shares: the server state, the cohort layout and the server step."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from fedjax_dp.core import rng, tree
from fedjax_dp.core.cohort import CohortEngine
from fedjax_dp.core.local_training import make_local_trainer


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """The options every algorithm takes by keyword: its server optimizer and how its sampled clients
    run (``core.cohort``: strategy, chunk size, scan unroll, device mesh)."""

    server_optimizer: optax.GradientTransformation = dataclasses.field(default_factory=lambda: optax.sgd(1.0))
    strategy: str = "vmap"
    chunk_size: int | None = None
    unroll: int | bool = 1
    mesh: Any = None

    def cohort_engine(self, client_fn) -> CohortEngine:
        return CohortEngine(client_fn, self.strategy, self.chunk_size, self.mesh)


@flax.struct.dataclass
class ServerState:
    """Global parameters, server optimizer state and the number of rounds applied."""

    params: Any
    opt_state: Any
    round: jax.Array


def init_server_state(params, server_optimizer: optax.GradientTransformation) -> ServerState:
    return ServerState(params=params, opt_state=server_optimizer.init(params), round=jnp.zeros((), jnp.int32))


def apply_server_gradient(state: ServerState, gradient, server_optimizer: optax.GradientTransformation) -> ServerState:
    """One server-optimizer step on an aggregated (pseudo-)gradient; the round counter advances."""
    updates, opt_state = server_optimizer.update(gradient, state.opt_state, state.params)
    return state.replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state, round=state.round + 1)


def apply_server_update(
    state: ServerState, mean_delta, server_optimizer: optax.GradientTransformation
) -> ServerState:
    """Treats ``-mean_delta`` as the server's pseudo-gradient (Reddi et al. 2021, FedOpt).

    Plain SGD with learning rate 1 gives classic FedAvg: ``w_{t+1} = w_t + mean_delta``.
    """
    return apply_server_gradient(state, jax.tree_util.tree_map(jnp.negative, mean_delta), server_optimizer)


def cohort_size(cohort) -> int:
    """Number of clients in a packed cohort (leading axis of its mask)."""
    return cohort["mask"].shape[0]


def make_client_delta(per_example_loss, client_optimizer: optax.GradientTransformation, unroll=1, regularizer=None):
    """``client_delta(params, client, lr_scale=1) -> (delta, stats, ok)``: ClientUpdate from ``params``
    on one packed client, its update Delta = w_k - w_t, and whether update and loss are finite (a
    client that is not is dropped by every algorithm, never added to the model)."""
    train = make_local_trainer(per_example_loss, client_optimizer, unroll=unroll, regularizer=regularizer)

    def client_delta(params, client, lr_scale=1.0):
        trained, stats = train(params, client["batches"], client["mask"], client["key"], lr_scale)
        delta = jax.tree_util.tree_map(jnp.subtract, trained, params)
        return delta, stats, tree.is_finite(delta) & jnp.isfinite(stats.loss)

    return client_delta


EVALUATION_PASS_KEYS = ("eval_batches", "eval_mask")
"""A cohort packed for UGA also holds each client's whole local data (``packing.pack_uga_cohort``)."""


def client_inputs(cohort, key: jax.Array) -> dict:
    """The per-client arrays the engine maps over, with one training key per client."""
    n = cohort_size(cohort)
    inputs = {"batches": cohort["batches"], "mask": cohort["mask"], "num_examples": cohort["num_examples"],
              "key": rng.client_keys(rng.purpose_key(key, rng.Purpose.CLIENT_TRAINING), n),
              "noise_key": rng.client_keys(rng.purpose_key(key, rng.Purpose.CLIENT_NOISE), n)}
    inputs.update({k: cohort[k] for k in EVALUATION_PASS_KEYS if k in cohort})
    return inputs
