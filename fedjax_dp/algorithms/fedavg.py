"""Federated Averaging (McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks
from Decentralized Data", Algorithm 1), with a server optimizer (Reddi et al. 2021).

Round t: every sampled client k runs ClientUpdate (E epochs of minibatch SGD from w_t) and returns
Delta w^k = w^k - w_t; the server forms the example-weighted mean
    Delta w = sum_k n_k Delta w^k / sum_k n_k
and applies it with the server optimizer (plain SGD, lr 1: w_{t+1} = w_t + Delta w): the server
optimizer receives the pseudo-gradient -Delta w (Reddi et al. 2021).

A client whose update or loss is not finite is dropped from the mean and counted in
``dropped_clients``; it can never reach the global model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.algorithms import base
from fedjax_dp.compression import traffic
from fedjax_dp.core import tree
from fedjax_dp.core.local_training import PerExampleLoss


@dataclasses.dataclass(frozen=True)
class FedAvg(base.EngineOptions):
    """FedAvg over packed cohorts ``{'batches': {...}, 'mask': (C, S, B), 'num_examples': (C,)}``.

    The family of weighted-mean algorithms shares this class: a client returns a pseudo-gradient
    (``-Delta w^k`` here; UGA's meta-gradient g^k in ``uga.py``), the server averages them with
    weights n_k and takes one server-optimizer step. Subclasses change ``make_client_update`` or
    ``regularizer`` only. ``client_lr_decay`` multiplies the client learning rate by
    ``decay ** t`` in round t (the seed-002 experiments decay 0.992 per round).
    """

    per_example_loss: PerExampleLoss
    client_optimizer: optax.GradientTransformation
    client_lr_decay: float = 1.0
    compressor: Any = None  # compression.pytree.LayerwiseCompressor: uploads are measurements

    needs_evaluation_pass: ClassVar[bool] = False  # cohorts need each client's whole data (UGA)

    def __post_init__(self):
        if not 0 < self.client_lr_decay <= 1:
            raise ValueError(f"client learning-rate decay must lie in (0, 1], got {self.client_lr_decay}")
        client_update = self.make_client_update()
        if self.compressor is not None:
            client_update = _compressed(client_update, self.compressor)

        def client_fn(shared, client):
            params, round_index = shared
            lr_scale = jnp.power(jnp.float32(self.client_lr_decay), round_index.astype(jnp.float32))
            pseudo_grad, stats, ok = client_update(params, client, lr_scale)
            weight = jnp.where(ok, client["num_examples"].astype(jnp.float32), 0.0)
            weighted = jax.tree_util.tree_map(lambda d: jnp.where(ok, d * weight, 0.0), pseudo_grad)
            per_client = {"loss": stats.loss, "finite": ok, "update_norm": tree.l2_norm(pseudo_grad)}
            return (weighted, weight, jnp.where(ok, stats.loss * weight, 0.0)), per_client

        engine = self.cohort_engine(client_fn)
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_server_step", jax.jit(self._server_step_impl))

    def regularizer(self):
        """The term added to every local step's loss (none for FedAvg; FedProx's proximal term)."""
        return None

    def make_client_update(self):
        """``(params, client, lr_scale) -> (pseudo_gradient, stats, ok)``; FedAvg sends ``-Delta w^k``."""
        client_delta = base.make_client_delta(self.per_example_loss, self.client_optimizer, self.unroll,
                                              self.regularizer())

        def client_update(params, client, lr_scale):
            delta, stats, ok = client_delta(params, client, lr_scale)
            return jax.tree_util.tree_map(jnp.negative, delta), stats, ok

        return client_update

    def init(self, params) -> base.ServerState:
        return base.init_server_state(params, self.server_optimizer)

    def upload_bytes(self, params) -> int:
        """Bytes one client sends per round (``compression.traffic``)."""
        if self.compressor is not None:
            return traffic.compressed_upload_bytes(self.compressor)
        return traffic.dense_upload_bytes(params)

    def round(self, state: base.ServerState, cohort, key: jax.Array):
        """One round over a packed cohort; returns ``(new_state, metrics)``."""
        sums, per_client = self._engine((state.params, state.round), base.client_inputs(cohort, key))
        return self._server_step(state, sums, per_client)

    def _server_step_impl(self, state, sums, per_client):
        weighted_sum, total_weight, loss_sum = sums
        denominator = jnp.maximum(total_weight, 1e-12)
        mean_grad = jax.tree_util.tree_map(lambda s: s / denominator, weighted_sum)
        new_state = base.apply_server_gradient(state, mean_grad, self.server_optimizer)
        any_kept = total_weight > 0
        new_state = new_state.replace(params=tree.where(any_kept, new_state.params, state.params),
                                      opt_state=tree.where(any_kept, new_state.opt_state, state.opt_state))
        metrics = {
            "train_loss": loss_sum / denominator,
            "dropped_clients": jnp.sum(~per_client["finite"]),
            "client_dropped": ~per_client["finite"],  # per cohort position (the loop logs client ids)
            "mean_update_norm": jnp.mean(per_client["update_norm"]),
        }
        return new_state, metrics


def _compressed(client_update, compressor):
    """The client uploads y = Phi(update) layer by layer; the server's reconstruction Rec(y) takes its
    place in the weighted mean (reconstructed per client, so non-linear Rec such as ISTA is exact)."""

    def update(params, client, lr_scale):
        pseudo_grad, stats, ok = client_update(params, client, lr_scale)
        return compressor.reconstruct(compressor.compress(pseudo_grad)), stats, ok

    return update
