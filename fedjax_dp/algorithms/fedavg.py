"""Federated Averaging (McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks
from Decentralized Data", Algorithm 1), with a server optimizer (Reddi et al. 2021).

Round t: every sampled client k runs ClientUpdate (E epochs of minibatch SGD from w_t, client
learning rate times ``client_lr_decay ** t``) and uploads Delta w^k = w^k - w_t with weight n_k; the
generic round (``core.round``) forms Delta w = sum_k n_k Delta w^k / sum_k n_k, and the server
applies it with its optimizer (plain SGD at rate 1: w_{t+1} = w_t + Delta w; the optimizer receives
the pseudo-gradient -Delta w). Subclasses change the local objective (``regularizer``: FedProx) or
what is uploaded (``local_upload``: UGA).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import optax

from fedjax_dp.algorithms import registry
from fedjax_dp.core import tree
from fedjax_dp.core.algorithm import (
    ClientOut,
    Requirements,
    ServerState,
    apply_mean_upload,
    check_decay,
    init_server_state,
    lr_scale,
)
from fedjax_dp.core.deferred_dense import deferrable_kernels, make_deferred_dense_sgd_trainer
from fedjax_dp.core.local_training import PerExampleLoss, make_local_trainer


@dataclasses.dataclass(frozen=True)
class FedAvg:
    per_example_loss: PerExampleLoss
    client_optimizer: optax.GradientTransformation
    # the rest by keyword: a field added here cannot shift a builder's arguments (f085950)
    _: dataclasses.KW_ONLY
    server_optimizer: optax.GradientTransformation = dataclasses.field(
        default_factory=lambda: optax.sgd(1.0)
    )
    client_lr_decay: float = 1.0
    unroll: int | bool = 1  # lax.scan unroll of local training
    # client_optimizer is optax.sgd at this rate: defer large dense kernels
    deferred_dense_rate: float | None = None

    requirements: ClassVar[Requirements] = Requirements()

    def __post_init__(self):
        check_decay(self.client_lr_decay)

    def init(self, params, key=None) -> ServerState:
        return init_server_state(params, self.server_optimizer)

    def upload_template(self, params):
        return params

    def broadcast(self, state: ServerState):
        return state.params, state.round

    def regularizer(self):
        """The term added to every local step's loss (none for FedAvg; FedProx's proximal term)."""
        return None

    def local_trainer(self, params, client):
        """ClientUpdate's local training for this client's shapes: plain SGD with large dense
        kernels deferred where ``deferred_dense_rate`` is set and a kernel qualifies (the same
        function up to float rounding, fewer passes over the kernel), else
        ``make_local_trainer``."""
        regularizer = self.regularizer()
        if self.deferred_dense_rate is not None and regularizer is None:
            deferred = deferrable_kernels(
                self.per_example_loss, params, client["batches"], client["key"]
            )
            if deferred:
                return make_deferred_dense_sgd_trainer(
                    self.per_example_loss, self.deferred_dense_rate, deferred, unroll=self.unroll
                )
        return make_local_trainer(
            self.per_example_loss,
            self.client_optimizer,
            unroll=self.unroll,
            regularizer=regularizer,
        )

    def local_upload(self, params, client, scale):
        """``(upload, stats, ok)``: ClientUpdate's Delta w^k = w^k - w_t and its ``LocalStats``."""
        train = self.local_trainer(params, client)
        trained, stats = train(params, client["batches"], client["mask"], client["key"], scale)
        delta = jax.tree_util.tree_map(jnp.subtract, trained, params)
        return delta, stats, tree.is_finite(delta) & jnp.isfinite(stats.loss)

    def client_update(self, shared, client, client_state, key) -> ClientOut:
        params, round_index = shared
        return self.client_out(params, client, lr_scale(self.client_lr_decay, round_index))

    def client_out(self, params, client, scale) -> ClientOut:
        """ClientUpdate from ``params`` with every local step's update multiplied by ``scale`` (a
        scalar, or one factor per step: ``core.local_training``), as a ``ClientOut``."""
        upload, stats, ok = self.local_upload(params, client, scale)
        data_loss = None if self.regularizer() is None else stats.data_loss
        return ClientOut(
            upload, client["num_examples"].astype(jnp.float32), None, stats.loss, ok, data_loss
        )

    def server_update(self, state: ServerState, aggregate, key):
        return (
            apply_mean_upload(state, aggregate.mean, aggregate.applies, self.server_optimizer),
            {},
        )


def build_fedavg(ctx) -> tuple:
    return (
        FedAvg(
            ctx.model.per_example_loss,
            ctx.client_optimizer(),
            **ctx.client_fields(),
            deferred_dense_rate=ctx.deferred_dense_rate(),
        ),
        (),
    )


registry.register(
    "fedavg",
    build=build_fedavg,
    privacy_keys=(),
    scaled_rates=True,
    summary="FedAvg (McMahan et al. 2017) with a server optimizer",
)
registry.register(
    "fedshare",
    build=build_fedavg,
    shares_server_set=True,
    privacy_keys=(),
    summary="FedShare (Zhao et al. 2018): FedAvg on client data mixed with a globally shared set",
)
