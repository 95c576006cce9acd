"""Canary clients through the upload chain (Andrew et al. 2024, "One-shot empirical privacy
estimation for federated learning", Sec. 4: canaries are clients whose update is a fixed random
direction).

A canary does no training: its update is its unit direction (``canary_direction``, regenerated from
a public key and its index, never stored) times a norm. Two families of directions: ``gaussian``
(isotropic, Andrew et al.'s) and ``rademacher`` (signs +-1/sqrt(d) from a counter hash, about ten
times cheaper to regenerate: ``rademacher_direction``). It is sent as a client's update is
(``core.round.send``: clipping, local noise, compression, rotation and modular shares), with its
own noise keys (``rng.Purpose.CANARY_NOISE``) and a fresh per-client state where a transform keeps
one, and its sum joins the cohort's before the server sides run (central noise, decoding). It
weighs 1, as a client under uniform weights does, and adds nothing to the training loss.

The canaries of a round are processed one at a time (a scan: one model-sized vector in flight, which
stays in cache, where a vmapped chunk of 32 ran at memory speed and cost twice as much); the round's
canaries are padded to a multiple of ``PAD`` so that the compiled shapes stay few, and a padded slot
is skipped (``lax.cond``), not computed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_dp.core import rng
from fedjax_dp.core.algorithm import ClientOut
from fedjax_dp.core.unrolled_threefry import unrolled

PAD = 32


class CanaryCohort(NamedTuple):
    """The canaries taking part in a round: their indices (padded to a multiple of ``PAD``),
    which slots are real, the population index each stands in for (a per-client mechanism's
    ``client_id``), the directions' public key, the update norm and the family of directions
    (``DIRECTIONS``)."""

    index: Any  # (n,) int32, n a multiple of ``PAD``
    present: Any  # (n,) bool
    client_id: Any  # (n,) int32
    key: Any  # the directions' key (``rng.Stream.CANARIES`` of the run's seed)
    norm: float
    directions: str = "gaussian"


def gaussian_direction(key: jax.Array, index, dim: int) -> jax.Array:
    """Canary ``index``'s unit direction in R^dim: isotropic (a normalised standard normal), drawn
    with ``core.unrolled_threefry`` (the same numbers as ``jax.random.normal``, ~3x faster on a
    CPU: regenerated for every canary in every round, it is most of what a canary costs)."""
    g = jax.random.normal(unrolled(jax.random.fold_in(key, index)), (dim,), jnp.float32)
    return g / jnp.linalg.norm(g)


def _lowbias32(x: jax.Array) -> jax.Array:
    """C. Wellons' ``lowbias32`` integer hash (2-round xorshift-multiply, found by his "hash
    prospector"; a bijection of uint32 with avalanche bias 0.17 per mille)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def rademacher_direction(key: jax.Array, index, dim: int) -> jax.Array:
    """Canary ``index``'s unit direction in R^dim: independent-looking signs +-1/sqrt(dim), the
    sign of coordinate j the top bit of ``lowbias32(j * 0x9E3779B9 + s)`` with s a 32-bit word
    drawn from the canary's key (a counter hash, ~10 integer operations a coordinate, where a
    threefry normal takes ~100 and an inverse error function).

    Any fixed directions give a valid audit (the canaries are the auditor's choice); what matters
    is that the unseen canaries' statistics are the null of the inserted ones', which holds for any
    directions drawn independently of the run. A Rademacher direction is exactly unit norm; its
    cosine with a fixed vector v has variance exactly 1/dim, as an isotropic one's, and is
    Gaussian in the limit whenever no coordinate dominates v (Lindeberg). It passes coordinate-wise
    transforms unchanged in shape (sign compression keeps it whole; top-k keeps k/dim of its mass,
    an isotropic direction's largest coordinates keep more). ``tests/test_in_run_audit.py`` checks
    the cosines between canaries and with structured vectors against N(0, 1/dim)."""
    word = jax.random.bits(jax.random.fold_in(key, index), (), jnp.uint32)
    coordinate = jnp.arange(dim, dtype=jnp.uint32)
    top = _lowbias32(coordinate * jnp.uint32(0x9E3779B9) + word) >> 31
    value = np.float32(1.0 / np.sqrt(dim))
    return jnp.where(top == 1, value, -value)


DIRECTIONS = {"gaussian": gaussian_direction, "rademacher": rademacher_direction}


def canary_direction(key: jax.Array, index, dim: int, kind: str = "gaussian") -> jax.Array:
    """Canary ``index``'s unit direction of the family ``kind`` (``DIRECTIONS``)."""
    return DIRECTIONS[kind](key, index, dim)


def canary_sums(send, uploads, template, client_state_init=None, directions: str = "gaussian"):
    """``fn(states, inputs, cohort, noise_key) -> summed`` (``send``'s summed record over the
    canaries), jitted: each canary's update through the chain's client sides, its direction of the
    family ``directions``."""
    flat, unravel = ravel_pytree(template)
    dim = flat.shape[0]
    direction = DIRECTIONS[directions]

    def one(states, inputs, key, norm, index, present, client_id, noise_key, count_key):
        upload = unravel(norm * direction(key, index, dim))
        client = {
            "num_examples": jnp.where(present, 1, 0),
            "noise_key": noise_key,
            "count_key": count_key,
            "client_id": client_id,
        }
        if client_state_init is not None:
            client["upload_client_state"] = client_state_init
        out = ClientOut(upload, jnp.float32(1.0), None, jnp.float32(0.0), jnp.bool_(True))
        summed, _ = send(uploads, states, inputs, client, out, jnp.bool_(True))
        return summed

    def fn(states, inputs, cohort: CanaryCohort, noise_key):
        n = cohort.index.shape[0]
        per_canary = lambda purpose: rng.client_keys(rng.purpose_key(noise_key, purpose), n)  # noqa: E731
        columns = (
            cohort.index,
            cohort.present,
            cohort.client_id,
            per_canary(rng.Purpose.CANARY_NOISE),
            per_canary(rng.Purpose.CANARY_COUNT_NOISE),
        )

        def canary(*column):
            return one(states, inputs, cohort.key, cohort.norm, *column)

        row = jax.tree_util.tree_map(lambda x: x[0], columns)
        shapes = jax.eval_shape(canary, *row)
        zero = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        def add_one(total, column):
            summed = jax.lax.cond(column[1], lambda: canary(*column), lambda: zero)
            return jax.tree_util.tree_map(jnp.add, total, summed), None

        total, _ = jax.lax.scan(add_one, zero, columns)
        return total

    jitted = jax.jit(fn)
    return lambda states, inputs, cohort, noise_key: jitted(
        states, inputs, cohort._replace(directions=None), noise_key
    )


def add_canaries(sums: dict, canaries: dict) -> dict:
    """The cohort's sums with the canaries': the upload (an integer share wraps as the modular sum
    does), the transforms' summed extras, and their weight apart (``canary_weight``: it counts in
    the denominator, not in the training loss)."""
    out = dict(sums)
    out["upload"] = jax.tree_util.tree_map(jnp.add, sums["upload"], canaries["upload"])
    out["extras"] = jax.tree_util.tree_map(jnp.add, sums["extras"], canaries["extras"])
    out["canary_weight"] = canaries["weight"]
    return out
