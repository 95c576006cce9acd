"""Randomness discipline: one root key per experiment, never a reused noise key.

``round_key(root, t)`` folds the round number into the root key; ``purpose_key`` then derives a
key for one purpose (client training, server noise, sampling...) by folding a fixed integer tag,
and ``client_keys`` splits one key per client. Because each derivation is a ``fold_in`` with a
distinct integer, two purposes or two rounds can never share a key.
"""

from __future__ import annotations

import enum

import jax


class Purpose(enum.IntEnum):
    """Tags of the independent random streams of one round."""

    CLIENT_TRAINING = 1
    CLIENT_NOISE = 2
    SERVER_NOISE = 3
    CLIP_ADAPTATION = 4
    SAMPLING = 5
    EVALUATION = 6
    SERVER_META = 7


def round_key(root: jax.Array, round_index: int | jax.Array) -> jax.Array:
    """Key of round ``round_index`` derived from the experiment's root key."""
    return jax.random.fold_in(root, round_index)


def purpose_key(key: jax.Array, purpose: Purpose) -> jax.Array:
    """Key for one purpose within a round."""
    return jax.random.fold_in(key, int(purpose))


def client_keys(key: jax.Array, num_clients: int) -> jax.Array:
    """One independent key per client of a cohort, shape ``(num_clients, ...)``."""
    return jax.random.split(key, num_clients)
