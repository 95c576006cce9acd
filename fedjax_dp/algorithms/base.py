"""What every algorithm shares: the server state, the cohort layout and the server step."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class ServerState:
    """Global parameters, server optimizer state and the number of rounds applied."""

    params: Any
    opt_state: Any
    round: jax.Array


def init_server_state(params, server_optimizer: optax.GradientTransformation) -> ServerState:
    return ServerState(params=params, opt_state=server_optimizer.init(params), round=jnp.zeros((), jnp.int32))


def apply_server_update(
    state: ServerState, mean_delta, server_optimizer: optax.GradientTransformation
) -> ServerState:
    """Treats ``-mean_delta`` as the server's pseudo-gradient (Reddi et al. 2021, FedOpt).

    Plain SGD with learning rate 1 gives classic FedAvg: ``w_{t+1} = w_t + mean_delta``.
    """
    pseudo_grad = jax.tree_util.tree_map(jnp.negative, mean_delta)
    updates, opt_state = server_optimizer.update(pseudo_grad, state.opt_state, state.params)
    return ServerState(optax.apply_updates(state.params, updates), opt_state, state.round + 1)


def cohort_size(cohort) -> int:
    """Number of clients in a packed cohort (leading axis of its mask)."""
    return cohort["mask"].shape[0]
