"""Exact rejection sampling of a whole vector, fast on a CPU: each coordinate takes the first
accepted of its own independent proposals (``rejection_sample``), the proposals made for every
coordinate at once and the few coordinates left redrawn in a small buffer, where redrawing whole
vectors until every coordinate is accepted took ~15 rounds of full draws for 2^18 coordinates. The
discrete Gaussian's and the Poisson's samplers of distributed DP use it (``discrete_noise``,
``poisson``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dp.core.unrolled_threefry import unrolled

MAX_ROUNDS = 200  # rejection rounds; each accepts >= ~half of what is left, so 200 never binds
LEFTOVER_SHARE = 16  # the second pass's buffer: 1/16 of the coordinates by default


def _until_accepted(propose, key: jax.Array, value, done):
    """Redraws every coordinate not ``done`` until each is accepted (all of ``value``'s shape each
    round, so it runs on few coordinates or few rounds)."""

    def body(carry):
        i, value, done = carry
        y, accept = propose(jax.random.fold_in(key, i), value.shape)
        return i + 1, jnp.where(done, value, y), done | accept

    def more(carry):
        i, _, done = carry
        return (i < MAX_ROUNDS) & ~jnp.all(done)

    _, value, done = jax.lax.while_loop(more, body, (jnp.int32(0), value, done))
    return value, done


def rejection_sample(propose, key: jax.Array, size: int, candidates: int, leftover_share=None):
    """``size`` draws by rejection: ``propose(key, shape) -> (proposals, accepted)`` makes
    independent proposals, and each coordinate takes the first accepted of its own, so the draws
    are exact whatever order the proposals are made in.

    Made in three passes, for speed on a vector of 2^18 coordinates per client: ``candidates``
    proposals for every coordinate at once; the coordinates left (about (1 - p)^candidates of
    them, p the acceptance rate), gathered into a buffer of 1/``leftover_share`` of the vector and
    redrawn until accepted; and, should more be left than the buffer holds (about 1e-300 for 2^18
    coordinates at the rates here), the whole vector's leftovers redrawn. Redrawing whole vectors
    until every one of 2^18 coordinates is accepted took ~15 rounds of full draws."""
    leftover_share = leftover_share or LEFTOVER_SHARE
    first, second, third = (unrolled(jax.random.fold_in(key, i)) for i in range(3))
    y, accept = propose(first, (candidates, size))
    value = jnp.take_along_axis(y, jnp.argmax(accept, axis=0)[None], axis=0)[0]
    done = jnp.any(accept, axis=0)
    slots = min(size, max(64, -(-size // leftover_share)))
    (left,) = jnp.nonzero(~done, size=slots, fill_value=size)  # size: an empty slot
    redrawn, filled = _until_accepted(propose, second, jnp.zeros(slots, y.dtype), left == size)
    value = value.at[left].set(redrawn, mode="drop")
    done = done.at[left].set(filled, mode="drop")
    return _until_accepted(propose, third, value, done)[0]
