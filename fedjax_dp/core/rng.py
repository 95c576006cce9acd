"""Randomness discipline: independent streams per run, never a reused key.

**The rule**: every key has exactly one use. It is *folded* (``fold_in`` with distinct tags),
*split* (``split``, once), or *drawn from* (``normal``, ``bits``, ...: once), never two of these.
With JAX's partitionable threefry (the default) ``fold_in(k, d) == split(k, n)[d]``, and a 32-bit
draw's word at flat index i is the XOR of the two words of ``split(k, N)[i]``: a key both split and
folded, or split and drawn from, hands two consumers the same randomness (as once the local
adaptive clip's count noise ``fold_in(k, 4)`` was leaf 4's upload noise). So every purpose gets its
own ``fold_in`` tag on a key that is only ever folded, before any split, and a consumer that needs
several independent draws splits its own key and nothing else touches it.
``tests/test_key_discipline.py`` records every key a run uses, inside jit and vmap, and checks the
rule.

The tree of a round t (each arrow one use):

* ``rounds`` -fold(t)-> R_t -fold(purpose)-> ``CLIENT_TRAINING`` -split(cohort)-> each client's
  training key (split into local steps), ``EVALUATION`` -split(cohort)-> each client's evaluation
  key (UGA's whole-data pass), ``SERVER_META`` (FedMeta's steps);
* ``noise`` -fold(t)-> N_t -fold(purpose)-> ``CLIENT_NOISE`` -split(cohort)-> each client's noise
  key (one
  consumer: local upload noise split into leaves, or the DP-SGD steps' noise split into steps),
  ``CLIENT_COUNT_NOISE`` -split(cohort)-> each client's count-noise key (a local adaptive clip's
  counts), ``CANARY_NOISE`` and ``CANARY_COUNT_NOISE`` -split(canaries)-> the same for each canary
  client of an audit (``privacy.audit.canaries``), ``SERVER_NOISE`` (central noise, split into
  leaves), ``CLIP_ADAPTATION`` (a central adaptive clip's count noise).

A run has three device streams derived from its seed (``run_streams``): ``rounds`` (round t's key is
``round_key(rounds, t)``, from which ``purpose_key`` derives client training, evaluation...),
``model_init`` and ``noise`` (round t's noise key is ``round_key(noise, t)``: every DP noise draw of
the round derives from it). Each is a ``fold_in`` of the root with its own tag, and round keys are a
second ``fold_in`` of a stream, so no round key equals the model-initialisation key (round 6's key
once did) and the training and noise keys of a round never meet.

``secure=True`` (``privacy.secure_rng``) takes the noise stream from 64 bits of OS entropy, never
written anywhere: the noise cannot be reproduced from ``config.json``. The host-side generators
(``host_generators``) are likewise two independent streams, one for client sampling and one for
per-client batch shuffles, so logged cohort sizes say nothing about shuffles and vice versa; with
``secure`` both come from OS entropy.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax
import numpy as np


class Purpose(enum.IntEnum):
    """Tags of the independent random streams of one round."""

    CLIENT_TRAINING = 1
    CLIENT_NOISE = 2
    SERVER_NOISE = 3
    CLIP_ADAPTATION = 4
    SAMPLING = 5
    EVALUATION = 6
    SERVER_META = 7
    CLIENT_COUNT_NOISE = 8
    CANARY_NOISE = 9  # the canary clients' upload noise (``privacy.audit``)
    CANARY_COUNT_NOISE = 10  # the canary clients' count noise
    HYPERGRAD = 11  # the held-out batch of a hyper-gradient step (``hypergrad``)
    HYPERGRAD_NOISE = 12  # the noise of the clients' hyper-gradient releases (``hypergrad``)


class Stream(enum.IntEnum):
    """Tags folded into a seed's root key: a run's streams, and the public streams of compressed
    sensing's shared random matrices (``public_key``), so a compression seed equal to the run's seed
    shares no key with the run."""

    ROUNDS = 0
    MODEL_INIT = 1
    NOISE = 2
    MEASUREMENT = 3  # compressed sensing's measurement matrices, folded with the tile index
    MEASUREMENT_START = 4  # the power iteration's start vector (the operator's Lipschitz estimate)
    CANARIES = 5  # the audit's canary directions and coins (public: the auditor knows them)


class RunStreams(NamedTuple):
    rounds: jax.Array  # round t: round_key(rounds, t)
    model_init: jax.Array
    noise: jax.Array  # round t's noise: round_key(noise, t)


def _os_entropy(entropy: int | None, stream: int) -> np.random.SeedSequence:
    """A fresh OS-entropy seed sequence (``entropy`` None), or one of the ``entropy`` that process 0
    drew and gave every process (``core.hosts.shared_entropy``), one per ``stream``."""
    return (
        np.random.SeedSequence()
        if entropy is None
        else np.random.SeedSequence(entropy, spawn_key=(stream,))
    )


def run_streams(seed: int, secure: bool = False, entropy: int | None = None) -> RunStreams:
    """The device streams of a run (module docstring); ``secure``: the noise stream from OS entropy
    (``entropy``: the entropy every process of a several-host run shares)."""
    root = jax.random.key(seed)
    noise = jax.random.fold_in(root, int(Stream.NOISE))
    if secure:
        noise = jax.random.wrap_key_data(
            np.frombuffer(_os_entropy(entropy, 0).generate_state(2).tobytes(), np.uint32),
            impl="threefry2x32",
        )
    return RunStreams(
        jax.random.fold_in(root, int(Stream.ROUNDS)),
        jax.random.fold_in(root, int(Stream.MODEL_INIT)),
        noise,
    )


def public_key(seed: int, stream: Stream) -> jax.Array:
    """A public stream of ``seed`` (``Stream.MEASUREMENT``...): never secret, disjoint from every
    run stream."""
    if stream in (Stream.ROUNDS, Stream.MODEL_INIT, Stream.NOISE):
        raise ValueError(f"{stream!r} is a run stream, not a public one")
    return jax.random.fold_in(jax.random.key(seed), int(stream))


def host_generators(
    seed: int, secure: bool = False, entropy: int | None = None
) -> tuple[np.random.Generator, np.random.Generator]:
    """``(sampling, shuffling)``: independent numpy generators for client sampling and batch
    shuffles."""
    if secure:  # SeedSequence() draws its entropy from the OS
        return np.random.default_rng(_os_entropy(entropy, 1)), np.random.default_rng(
            _os_entropy(entropy, 2)
        )
    sampling, shuffling = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(sampling), np.random.default_rng(shuffling)


def round_key(root: jax.Array, round_index: int | jax.Array) -> jax.Array:
    """Key of round ``round_index`` derived from a stream's key."""
    return jax.random.fold_in(root, round_index)


def purpose_key(key: jax.Array, purpose: Purpose) -> jax.Array:
    """Key for one purpose within a round."""
    return jax.random.fold_in(key, int(purpose))


def client_keys(key: jax.Array, num_clients: int) -> jax.Array:
    """One independent key per client of a cohort, shape ``(num_clients, ...)``."""
    return jax.random.split(key, num_clients)
