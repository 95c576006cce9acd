"""The round as a differentiable function of its scalar settings, and its hyper-gradient.

Settings (``SETTINGS``), each a multiplier on the configured value, kept as its logarithm:

* ``client_lr``: a factor eta_c on every local step's update (for SGD, momentum and Adam exactly a
  factor on the client learning rate, ``core.local_training``'s ``lr_scale``);
* ``server_lr``: a factor eta_s on the server optimizer's update (``core.algorithm``'s
  ``update_scale``; for SGD w_{t+1} = w_t + eta_s lr_g Delta-bar);
* ``step_weights``: one factor omega_i per local step i (a schedule; step i's update is multiplied
  by eta_c omega_i).

Optimising theta = log(multiplier) keeps every learning rate positive whatever step is taken, and
makes the step scale-free: dL/dtheta = eta dL/deta (Baydin et al. 2018, "Online learning rate
adaptation with hypergradient descent", ICLR, Sec. 2, in log space).

``Hypertuned`` wraps FedAvg (and FedProx, UGA, DP-FedAvg, which are FedAvg with another local
objective, upload or chain) so that the settings live in the server state (``ServerState.extra``):
``FederatedRound.function`` then gives the round as a pure function of that state, through local
training (``lax.scan``), the upload chain's clipping and the aggregation, with every noise draw a
constant of the function (drawn from fixed keys: the reparameterised derivative, noise held fixed).
``hypergradient`` differentiates a held-out loss of the model after ``len(rounds)`` such rounds in
the settings (reverse mode: federated automatic differentiation of the round, Rush, Charles and
Garrett, "Federated automatic differentiation", TMLR 2024, Sec. 4's hyper-parameter example).

Memory (reverse mode through K clients of S local steps on a model of P parameters):

* lookahead 1: the backward pass keeps every client's per-step residuals, about K S (P + the
  activations of one batch) floats, besides the round itself (which under the cohort engine holds
  one chunk of clients at a time);
* lookahead r without rematerialisation: r times that;
* lookahead r with ``remat`` (``jax.checkpoint`` on each round): the r round-start server states
  (r P) plus one round's residuals, K S (P + activations), recomputed round by round.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_dp.core.algorithm import Aggregate, ClientOut, ServerState, apply_mean_upload, lr_scale
from fedjax_dp.core.local_training import masked_mean

SETTINGS = ("client_lr", "server_lr", "step_weights")
"""The adaptable settings (``hypergrad.adapt``)."""


def initial_settings(num_steps: int, dtype=jnp.float32) -> dict:
    """Log-multipliers 0: every setting at its configured value."""
    return {
        "client_lr": jnp.zeros((), dtype),
        "server_lr": jnp.zeros((), dtype),
        "step_weights": jnp.zeros((max(num_steps, 1),), dtype),
    }


def step_scales(settings: dict, num_steps: int) -> jax.Array:
    """eta_c omega_i for each of ``num_steps`` local steps: a step past the schedule's length keeps
    omega 1."""
    log_w = settings["step_weights"]
    if num_steps > log_w.shape[0]:
        log_w = jnp.concatenate([log_w, jnp.zeros((num_steps - log_w.shape[0],), log_w.dtype)])
    return jnp.exp(settings["client_lr"] + log_w[:num_steps])


@dataclasses.dataclass(frozen=True)
class Hypertuned:
    """``base`` (a FedAvg, or a subclass) with its client learning rate, server learning rate and
    per-step weights multiplied by the settings held in ``ServerState.extra`` (log-multipliers,
    ``initial_settings``). With every log-multiplier 0 it computes what ``base`` computes, up to
    multiplications by 1."""

    base: Any
    num_steps: int

    @property
    def requirements(self):
        return self.base.requirements

    def __getattr__(self, name):  # what the loop asks of the algorithm it wraps
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def init(self, params, key=None) -> ServerState:
        state = self.base.init(params, key)
        if state.extra is not None:
            raise ValueError(
                f"hypergrad: {type(self.base).__name__} keeps its own server state; the settings"
                " cannot join it"
            )
        return state.replace(extra=initial_settings(self.num_steps))

    def upload_template(self, params):
        return self.base.upload_template(params)

    def broadcast(self, state: ServerState):
        return self.base.broadcast(state), state.extra

    def client_update(self, shared, client, client_state, key) -> ClientOut:
        (params, round_index), settings = shared
        steps = client["mask"].shape[0]
        decay = lr_scale(self.base.client_lr_decay, round_index, settings["client_lr"].dtype)
        return self.base.client_out(params, client, decay * step_scales(settings, steps))

    def server_update(self, state: ServerState, aggregate: Aggregate, key):
        scale = jnp.exp(state.extra["server_lr"])
        optimizer = self.base.server_optimizer
        return apply_mean_upload(state, aggregate.mean, aggregate.applies, optimizer, scale), {}


def held_out_loss(per_example_loss, params, batch: dict, mask, key) -> jax.Array:
    """The mean loss of ``params`` over the real examples (``mask``) of one held-out batch."""
    return masked_mean(per_example_loss(params, batch, key), mask)


def hypergradient(
    function,
    per_example_loss,
    state: ServerState,
    rounds: list,
    batch: dict,
    mask,
    key: jax.Array,
    remat: bool = False,
):
    """``(loss, grads)``: the held-out loss L(w_{t+r}) of the model after ``len(rounds)`` rounds
    from ``state`` with the settings ``state.extra`` (lookahead r), and its gradient in the
    log-multipliers (a dict like ``state.extra``).

    ``function``: ``FederatedRound.function``'s f; ``rounds``: its arguments for each round (the
    cohort, keys and chain inputs of rounds t, t+1, ...), whose noise stays fixed. ``remat``:
    ``jax.checkpoint`` on each round (module docstring, Memory)."""
    step = jax.checkpoint(function) if remat else function

    def objective(settings):
        s = state.replace(extra=settings)
        for args in rounds:
            s, _ = step(s, *args)
        return held_out_loss(per_example_loss, s.params, batch, mask, key)

    return jax.value_and_grad(objective)(state.extra)


def server_step_hypergradient(
    algorithm: Hypertuned, per_example_loss, state: ServerState, mean, batch, mask, key
):
    """``(loss, grads)`` of the held-out loss after the server step alone on the released mean
    ``mean`` (the aggregate after the chain's noise, ``RoundResult.released``): the hyper-gradient
    of the server learning rate as post-processing of what was released (the other settings'
    entries are 0: they act before the release)."""

    def objective(settings):
        aggregate = Aggregate(mean, jnp.ones(()), jnp.ones((), jnp.int32), fixed=True)
        new_state, _ = algorithm.server_update(state.replace(extra=settings), aggregate, key)
        return held_out_loss(per_example_loss, new_state.params, batch, mask, key)

    return jax.value_and_grad(objective)(state.extra)
