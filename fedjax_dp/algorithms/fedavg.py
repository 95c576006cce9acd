"""Federated Averaging (McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks
from Decentralized Data", Algorithm 1), with a server optimizer (Reddi et al. 2021).

Round t: every sampled client k runs ClientUpdate (E epochs of minibatch SGD from w_t) and returns
Delta w^k = w^k - w_t; the server forms the example-weighted mean
    Delta w = sum_k n_k Delta w^k / sum_k n_k
and applies it with the server optimizer (plain SGD, lr 1: w_{t+1} = w_t + Delta w).

A client whose update or loss is not finite is dropped from the mean and counted in
``dropped_clients``; it can never reach the global model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.algorithms import base
from fedjax_dp.core import tree
from fedjax_dp.core.cohort import CohortEngine
from fedjax_dp.core.local_training import PerExampleLoss


@dataclasses.dataclass(frozen=True)
class FedAvg:
    """FedAvg over packed cohorts ``{'batches': {...}, 'mask': (C, S, B), 'num_examples': (C,)}``."""

    per_example_loss: PerExampleLoss
    client_optimizer: optax.GradientTransformation
    server_optimizer: optax.GradientTransformation = dataclasses.field(default_factory=lambda: optax.sgd(1.0))
    strategy: str = "vmap"
    chunk_size: int | None = None
    unroll: int | bool = 1
    mesh: Any = None

    def __post_init__(self):
        client_delta = base.make_client_delta(self.per_example_loss, self.client_optimizer, self.unroll)

        def client_fn(params, client):
            delta, stats, ok = client_delta(params, client)
            weight = jnp.where(ok, client["num_examples"].astype(jnp.float32), 0.0)
            weighted = jax.tree_util.tree_map(lambda d: jnp.where(ok, d * weight, 0.0), delta)
            per_client = {"loss": stats.loss, "finite": ok, "update_norm": tree.l2_norm(delta)}
            return (weighted, weight, jnp.where(ok, stats.loss * weight, 0.0)), per_client

        engine = CohortEngine(client_fn, self.strategy, self.chunk_size, self.mesh)
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_server_step", jax.jit(self._server_step_impl))

    def init(self, params) -> base.ServerState:
        return base.init_server_state(params, self.server_optimizer)

    def round(self, state: base.ServerState, cohort, key: jax.Array):
        """One round over a packed cohort; returns ``(new_state, metrics)``."""
        sums, per_client = self._engine(state.params, base.client_inputs(cohort, key))
        return self._server_step(state, sums, per_client)

    def _server_step_impl(self, state, sums, per_client):
        weighted_sum, total_weight, loss_sum = sums
        denominator = jnp.maximum(total_weight, 1e-12)
        mean_delta = jax.tree_util.tree_map(lambda s: s / denominator, weighted_sum)
        new_state = base.apply_server_update(state, mean_delta, self.server_optimizer)
        any_kept = total_weight > 0
        new_state = new_state.replace(params=tree.where(any_kept, new_state.params, state.params),
                                      opt_state=tree.where(any_kept, new_state.opt_state, state.opt_state))
        metrics = {
            "train_loss": loss_sum / denominator,
            "dropped_clients": jnp.sum(~per_client["finite"]),
            "mean_update_norm": jnp.mean(per_client["update_norm"]),
        }
        return new_state, metrics
