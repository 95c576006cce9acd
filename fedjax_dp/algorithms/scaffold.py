"""SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", Algorithm 1 with option II), a CUAG-PFL baseline (seed 004; ALGORITHMS.md §4).

Server state: the model x and the server control variate c (``ServerState.extra``); each client i
keeps its own c_i (a per-client state, zero at first, passed in by the round). Round: each sampled
client runs K local SGD steps on the corrected gradient
    y <- y - eta_l (g_i(y) - c_i + c)
then sets c_i+ = c_i - c + (x - y) / (K eta_l) and uploads {model: Delta y_i = y - x, control: Delta
c_i = c_i+ - c_i} (twice FedAvg's traffic; upload transforms such as compression act on both).
Server: x <- x + eta_g mean_i Delta y_i (uniform mean over the kept clients, as in the paper,
through any optax server optimizer), c <- c + (1/N) sum_i Delta c_i with N the population. A client
whose update is not finite is dropped: it changes neither x nor c and keeps its old c_i. Option II's
control update assumes plain SGD clients (the registry refuses momentum or Adam).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import optax
import optax.tree_utils as otu

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
from fedjax_dp.core.local_training import PerExampleLoss, make_local_trainer


def _subtract(a, b):
    return jax.tree_util.tree_map(jnp.subtract, a, b)


def correction_regularizer(correction):
    """<y - x, c - c_i>, whose gradient in y is SCAFFOLD's correction c - c_i."""
    return lambda p, x: otu.tree_vdot(_subtract(p, x), correction)


@dataclasses.dataclass(frozen=True)
class Scaffold:
    per_example_loss: PerExampleLoss
    client_optimizer: optax.GradientTransformation
    # the rest by keyword: a field added here cannot shift a builder's arguments
    _: dataclasses.KW_ONLY
    local_learning_rate: float  # eta_l of the control update (the client optimizer's SGD rate)
    num_clients: int  # N, the population
    server_optimizer: optax.GradientTransformation = dataclasses.field(
        default_factory=lambda: optax.sgd(1.0)
    )
    client_lr_decay: float = 1.0
    unroll: int | bool = 1

    requirements: ClassVar[Requirements] = Requirements(client_state=True)

    def __post_init__(self):
        if not self.local_learning_rate > 0:
            raise ValueError(
                f"SCAFFOLD's local learning rate eta_l must be > 0, got {self.local_learning_rate}"
            )
        if not self.num_clients >= 1:
            raise ValueError(f"SCAFFOLD needs the population size N >= 1, got {self.num_clients}")
        check_decay(self.client_lr_decay)

    def init(self, params, key=None) -> ServerState:
        return init_server_state(
            params, self.server_optimizer, extra=self.client_state_init(params)
        )

    def client_state_init(self, params):
        """c_i of a client that has not taken part yet (and the initial server c): zero."""
        return jax.tree_util.tree_map(jnp.zeros_like, params)

    def upload_template(self, params):
        return {"model": params, "control": params}

    def broadcast(self, state: ServerState):
        return state.params, state.extra, state.round

    def client_update(self, shared, client, own_control, key) -> ClientOut:
        params, control, round_index = shared
        correction = _subtract(control, own_control)  # c - c_i
        scale = lr_scale(self.client_lr_decay, round_index)
        trained, stats = self.local_training(params, client, correction, key, scale)
        delta = _subtract(trained, params)

        # c_i+ = c_i - c + (x - y) / (K eta_l), K eta_l in the parameters' dtype
        def control_step(ci, c, d):
            steps = jnp.maximum(stats.num_steps, 1).astype(d.dtype)
            steps_times_lr = (
                steps
                * jnp.asarray(self.local_learning_rate, d.dtype)
                * lr_scale(self.client_lr_decay, round_index, d.dtype)
            )
            return jnp.where(stats.num_steps > 0, ci - c - d / steps_times_lr, ci)

        new_control = jax.tree_util.tree_map(control_step, own_control, control, delta)
        ok = tree.is_finite(delta) & tree.is_finite(new_control) & jnp.isfinite(stats.loss)
        upload = {"model": delta, "control": _subtract(new_control, own_control)}
        return ClientOut(upload, jnp.float32(1.0), new_control, stats.loss, ok, stats.data_loss)

    def local_training(self, params, client, correction, key, scale):
        """K local steps y <- y - eta_l (g_i(y) + c - c_i): the correction enters as the gradient of
        the regulariser <y - x, c - c_i>."""
        train = make_local_trainer(
            self.per_example_loss,
            self.client_optimizer,
            unroll=self.unroll,
            regularizer=correction_regularizer(correction),
        )
        return train(params, client["batches"], client["mask"], key, scale)

    def server_update(self, state: ServerState, aggregate, key):
        control = jax.tree_util.tree_map(
            lambda c, dc: c + dc / self.num_clients, state.extra, aggregate.sum["control"]
        )
        stepped = apply_mean_upload(
            state, aggregate.mean["model"], aggregate.applies, self.server_optimizer
        )
        return stepped.replace(extra=control), {}


def build_scaffold(ctx) -> tuple:
    c = ctx.cfg
    return (
        Scaffold(
            ctx.model.per_example_loss,
            ctx.client_optimizer(),
            local_learning_rate=c.client.learning_rate,
            num_clients=ctx.num_clients,
            **ctx.client_fields(),
        ),
        (),
    )


def check_scaffold(cfg, need) -> None:
    need(
        cfg.client.optimizer == "sgd" and not cfg.client.momentum,
        "scaffold's control-variate update (option II) assumes plain SGD clients; got "
        f"client.optimizer={cfg.client.optimizer!r}, client.momentum={cfg.client.momentum}",
    )


registry.register(
    "scaffold",
    build=build_scaffold,
    validate=check_scaffold,
    privacy_keys=(),
    summary="SCAFFOLD (Karimireddy et al. 2020), option II, per-client control variates",
)
