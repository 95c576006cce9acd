"""SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", Algorithm 1 with option II), a CUAG-PFL baseline (seed 004; ALGORITHMS.md §4).

Server state: the model x and the server control variate c; each client i keeps its own control c_i
(``core.client_states``, carried by the loop between rounds, zero at first). Round: each sampled client
runs K local SGD steps on the corrected gradient
    y <- y - eta_l (g_i(y) - c_i + c)
then sets c_i+ = c_i - c + (x - y) / (K eta_l) and uploads Delta y_i = y - x and Delta c_i = c_i+ - c_i
(twice FedAvg's traffic). Server: x <- x + eta_g mean_i Delta y_i (any optax server optimizer on the
pseudo-gradient -mean Delta y), c <- c + (1/N) sum_i Delta c_i with N the population.
The mean is uniform over the sampled clients, as in the paper. A client whose update is not finite is
dropped: it changes neither x nor c and keeps its old c_i. Option II's control update assumes plain SGD
clients (the factory refuses momentum or Adam).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from fedjax_dp.algorithms import base
from fedjax_dp.compression import traffic
from fedjax_dp.core import tree
from fedjax_dp.core.local_training import PerExampleLoss, make_local_trainer

CLIENT_STATE_KEY = "client_state"
"""Cohort key of the stacked per-client states the loop gathers; the round returns the new ones in its
metrics under the same key."""


@flax.struct.dataclass
class ScaffoldState:
    params: Any
    opt_state: Any
    round: jax.Array
    control: Any  # the server control variate c


def _subtract(a, b):
    return jax.tree_util.tree_map(jnp.subtract, a, b)


def _tree_vdot(a, b):
    return sum(jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x, y: jnp.sum(x * y), a, b)))


@dataclasses.dataclass(frozen=True)
class Scaffold(base.EngineOptions):
    per_example_loss: PerExampleLoss
    client_optimizer: optax.GradientTransformation
    local_learning_rate: float  # eta_l of the control update (the client optimizer's SGD rate)
    num_clients: int  # N, the population
    client_lr_decay: float = 1.0

    needs_evaluation_pass = False

    def __post_init__(self):
        if not self.local_learning_rate > 0:
            raise ValueError(f"SCAFFOLD's local learning rate eta_l must be > 0, got {self.local_learning_rate}")
        if not self.num_clients >= 1:
            raise ValueError(f"SCAFFOLD needs the population size N >= 1, got {self.num_clients}")
        if not 0 < self.client_lr_decay <= 1:
            raise ValueError(f"client learning-rate decay must lie in (0, 1], got {self.client_lr_decay}")
        engine = self.cohort_engine(self._client_fn)
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_server_step", jax.jit(self._server_step_impl))

    def init(self, params) -> ScaffoldState:
        return ScaffoldState(params=params, opt_state=self.server_optimizer.init(params),
                             round=jnp.zeros((), jnp.int32), control=self.client_state_template(params))

    def client_state_template(self, params):
        """c_i of a client that has not taken part yet: zero."""
        return jax.tree_util.tree_map(jnp.zeros_like, params)

    def upload_bytes(self, params) -> int:
        return 2 * traffic.dense_upload_bytes(params)  # Delta y and Delta c

    def _client_fn(self, shared, client):
        params, control, round_index = shared
        own_control = client[CLIENT_STATE_KEY]
        correction = _subtract(control, own_control)  # c - c_i
        train = make_local_trainer(self.per_example_loss, self.client_optimizer, unroll=self.unroll,
                                   regularizer=lambda p, x: _tree_vdot(_subtract(p, x), correction))  # gradient c - c_i
        lr_scale = jnp.power(jnp.float32(self.client_lr_decay), round_index.astype(jnp.float32))
        trained, stats = train(params, client["batches"], client["mask"], client["key"], lr_scale)
        delta = _subtract(trained, params)
        steps_times_lr = jnp.maximum(stats.num_steps, 1).astype(jnp.float32) * self.local_learning_rate * lr_scale
        new_control = jax.tree_util.tree_map(lambda ci, c, d: jnp.where(stats.num_steps > 0, ci - c - d / steps_times_lr, ci),
                                             own_control, control, delta)
        ok = tree.is_finite(delta) & tree.is_finite(new_control) & jnp.isfinite(stats.loss)
        kept = ok & (client["num_examples"] > 0)  # padding slots hold no data
        zero_unless_kept = lambda x: jnp.where(kept, x, 0.0)  # noqa: E731
        summed = (jax.tree_util.tree_map(zero_unless_kept, delta),
                  jax.tree_util.tree_map(lambda n, o: zero_unless_kept(n - o), new_control, own_control),
                  kept.astype(jnp.float32), jnp.where(kept, stats.loss, 0.0))
        per_client = {"finite": ok, "update_norm": tree.l2_norm(delta), CLIENT_STATE_KEY: new_control}
        return summed, per_client

    def round(self, state: ScaffoldState, cohort, key: jax.Array):
        """One round; ``cohort[CLIENT_STATE_KEY]`` holds the sampled clients' c_i (stacked). Metrics carry
        their c_i+ under the same key (the loop stores those of the clients not dropped)."""
        if CLIENT_STATE_KEY not in cohort:
            raise ValueError(f"SCAFFOLD needs the cohort's control variates under {CLIENT_STATE_KEY!r} "
                             "(core.client_states.ClientStateStore.gather)")
        inputs = {**base.client_inputs(cohort, key), CLIENT_STATE_KEY: cohort[CLIENT_STATE_KEY]}
        sums, per_client = self._engine((state.params, state.control, state.round), inputs)
        return self._server_step(state, sums, per_client)

    def _server_step_impl(self, state, sums, per_client):
        delta_sum, control_delta_sum, kept, loss_sum = sums
        count = jnp.maximum(kept, 1.0)
        mean_delta = jax.tree_util.tree_map(lambda d: d / count, delta_sum)
        stepped = base.apply_server_update(state, mean_delta, self.server_optimizer)
        any_kept = kept > 0
        control = jax.tree_util.tree_map(lambda c, dc: c + dc / self.num_clients, state.control, control_delta_sum)
        new_state = ScaffoldState(params=tree.where(any_kept, stepped.params, state.params),
                                  opt_state=tree.where(any_kept, stepped.opt_state, state.opt_state),
                                  round=stepped.round, control=control)
        metrics = {"train_loss": loss_sum / count, "dropped_clients": jnp.sum(~per_client["finite"]),
                   "client_dropped": ~per_client["finite"], "mean_update_norm": jnp.mean(per_client["update_norm"]),
                   CLIENT_STATE_KEY: per_client[CLIENT_STATE_KEY]}
        return new_state, metrics
