"""The noise strategies of correlated-noise DP-FL: a lower-triangular strategy matrix C (n x n, the
run's rounds) and C^{-1} as a ``jax_privacy`` ``StreamingMatrix``, which turns round t's iid
Gaussian draw into the correlated noise the server adds (row t of C^{-1} Z, jax_privacy's
``noise_addition``, Sec. 4.4 of McMahan et al. 2025, "Correlated Noise Mechanisms for Differentially
Private Learning"). Strategies:

* ``identity``: C = I: DP-FedAvg's independent noise (the baseline, accounted without
  amplification);
* ``tree``: binary-tree aggregation (DP-FTRL, Kairouz et al. 2021; ``tree_aggregation``);
* ``tree_restart``: the tree restarted every ``period`` rounds (DP-FTRL's TreeRestart, Kairouz et
  al. 2021, Sec. 4; by default the separation b, so each client takes part at most once per tree);
* ``tree_honaker``: the same tree with every node released and Honaker's efficient estimator
  (TensorFlow Privacy's ``EfficientTreeAggregator``): a rectangular C, one iid draw per level each
  round;
* ``banded``: a b-banded Toeplitz C, column-normalised, optimised for the mean squared error of the
  prefix sums (Choquette-Choo et al. 2023, "(Amplified) Banded Matrix Factorization";
  ``toeplitz.optimize_banded_toeplitz``);
* ``blt``: a buffered-linear-Toeplitz C optimised for the run's rounds and participation (Dvijotham,
  McMahan et al. 2024; McMahan et al. 2024, "Hassle-free Gboard DP";
  ``buffered_toeplitz.optimize``): O(buffers x parameters) state whatever the round;
* ``dense``: an optimised dense C for short runs (Denisov et al. 2022, Choquette-Choo et al. 2022;
  ``dense.optimize``); its stream keeps every past draw (O(n x parameters)).

Optimisation runs on the host in float64 (``jax.enable_x64`` for the call, never the process), once
per (strategy, rounds, participation) per process; the streams run in float32.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from jax_privacy.matrix_factorization import buffered_toeplitz, dense, streaming_matrix, toeplitz

from fedjax_dp.privacy.correlated import tree_aggregation
from fedjax_dp.privacy.correlated.participation import Participation

STRATEGIES = ("identity", "tree", "tree_restart", "tree_honaker", "banded", "blt", "dense")
MAX_DENSE_ROUNDS = 512  # dense optimisation is O(n^3) per step and its stream keeps n draws
# C materialised on the host (sensitivity of tree / cyclic patterns, errors)
MAX_MATERIALIZED_ROUNDS = 4096


@dataclasses.dataclass(frozen=True, eq=False)
class Strategy:
    """name: one of ``STRATEGIES``. rounds: n, the rounds C is defined for. noising: C^{-1},
    streamed. bands: C's bands where it is banded (identity: 1), else None. toeplitz_coef: C's
    Toeplitz coefficients where C is Toeplitz (before any column normalisation), else None.
    column_normalized: C's columns rescaled to norm 1. dense_matrix: C itself where it is neither.
    buffers: model-sized buffers the stream keeps (its memory). draws: iid model-sized draws the
    stream takes each round (a leading axis of its input when > 1). period: the rounds of each tree
    where the tree restarts (``tree_restart``), else None."""

    name: str
    rounds: int
    noising: streaming_matrix.StreamingMatrix
    buffers: int
    bands: int | None = None
    toeplitz_coef: np.ndarray | None = None
    column_normalized: bool = False
    dense_matrix: np.ndarray | None = None
    draws: int = 1
    period: int | None = None

    def matrix(self, rounds: int | None = None) -> np.ndarray:
        """What the first ``rounds`` rounds release, C's leading block in float64 (C is lower
        triangular: the first rounds' strategy; Honaker's tree: the nodes completed by then, a
        rectangular block)."""
        n = self.rounds if rounds is None else rounds
        if n > self.rounds:
            raise ValueError(f"strategy {self.name!r} is defined for {self.rounds} rounds, not {n}")
        if self.name == "tree_honaker":
            return tree_aggregation.honaker_strategy_matrix(n)
        if self.name == "tree":
            return tree_aggregation.strategy_matrix(self.rounds)[:n, :n]
        if self.name == "tree_restart":
            return tree_aggregation.restarted_strategy_matrix(self.rounds, self.period)[:n, :n]
        if self.dense_matrix is not None:
            return self.dense_matrix[:n, :n]
        column = np.zeros(self.rounds)
        column[: min(len(self.toeplitz_coef), self.rounds)] = self.toeplitz_coef[: self.rounds]
        C = scipy.linalg.toeplitz(column, np.zeros(self.rounds))
        if self.column_normalized:
            C = C / np.linalg.norm(C, axis=0, keepdims=True)
        return C[:n, :n]

    def decoder(self) -> np.ndarray:
        """B with A = B C (A: lower-triangular ones): row t turns the releases into prefix sum t's
        estimate."""
        if self.name == "tree_honaker":
            return tree_aggregation.honaker_decoder(self.rounds)
        return np.cumsum(np.linalg.inv(self.matrix()), axis=0)


def identity(rounds: int) -> Strategy:
    return Strategy(
        "identity", rounds, streaming_matrix.identity(), 0, bands=1, toeplitz_coef=np.ones(1)
    )


def tree(rounds: int) -> Strategy:
    return Strategy(
        "tree", rounds, tree_aggregation.noising_matrix(rounds), tree_aggregation.levels(rounds)
    )


def tree_restart(rounds: int, period: int) -> Strategy:
    """The tree restarted every ``period`` rounds (``tree_aggregation``; DP-FTRL's TreeRestart)."""
    if not 1 <= period <= rounds:
        raise ValueError(
            f"a restarted tree needs 1 <= period <= rounds={rounds}, got period={period}"
        )
    return Strategy(
        "tree_restart",
        rounds,
        tree_aggregation.noising_matrix(rounds, period),
        tree_aggregation.levels(period),
        period=period,
    )


@functools.lru_cache(maxsize=16)
def _banded_coef(rounds: int, bands: int) -> tuple:
    return tuple(float(c) for c in np.asarray(toeplitz.optimize_banded_toeplitz(rounds, bands)))


def tree_honaker(rounds: int) -> Strategy:
    depth = tree_aggregation.levels(rounds)
    return Strategy(
        "tree_honaker", rounds, tree_aggregation.honaker_noising(rounds), depth, draws=depth
    )


def banded(rounds: int, bands: int) -> Strategy:
    """A ``bands``-banded Toeplitz strategy with unit L2 coefficients, columns normalised for
    ``rounds`` rounds (every column of C then has norm 1: jax_privacy's
    ``inverse_as_streaming_matrix(column_normalize_for_n=n)``)."""
    if not 1 <= bands <= rounds:
        raise ValueError(
            f"a banded strategy needs 1 <= bands <= rounds={rounds}, got bands={bands}"
        )
    coef = np.asarray(_banded_coef(rounds, bands))
    noising = toeplitz.inverse_as_streaming_matrix(
        jnp.asarray(coef, jnp.float32), column_normalize_for_n=rounds
    )
    return Strategy(
        "banded",
        rounds,
        noising,
        bands - 1,
        bands=bands,
        toeplitz_coef=coef,
        column_normalized=True,
    )


@functools.lru_cache(maxsize=16)
def _blt_parameters(rounds: int, min_sep: int, max_participations: int) -> tuple:
    with jax.enable_x64(True):
        blt = buffered_toeplitz.optimize(
            n=rounds, min_sep=min_sep, max_participations=max_participations, error="mean"
        )
        inverse = blt.inverse()
        return tuple(
            np.asarray(x, np.float64)
            for x in (blt.buf_decay, blt.output_scale, inverse.buf_decay, inverse.output_scale)
        )


def blt(rounds: int, participation: Participation) -> Strategy:
    """A BLT optimised for ``rounds`` rounds under ``participation`` (min-separation b with k
    participations; cyclic groups are a case of it), mean squared error of the prefix sums."""
    b = 1 if participation.scheme == "single" else participation.min_separation
    decay, scale, inv_decay, inv_scale = _blt_parameters(
        rounds, b, participation.participations(rounds)
    )
    powers = np.arange(rounds - 1)
    coef = np.append(1.0, (decay ** powers[:, None] * scale).sum(axis=1))
    inverse = buffered_toeplitz.BufferedToeplitz.build(
        inv_decay.astype(np.float32), inv_scale.astype(np.float32), dtype=jnp.float32
    )
    return Strategy(
        "blt", rounds, inverse.as_streaming_matrix(), len(inv_decay), toeplitz_coef=coef
    )


@functools.lru_cache(maxsize=8)
def _dense_matrix(rounds: int, scheme: str, b: int, k: int) -> np.ndarray:
    """jax_privacy's ``dense.optimize`` returns the lower-triangular strategy C itself (not its Gram
    matrix)."""
    with jax.enable_x64(True):
        if scheme == "cyclic":
            C = dense.optimize(rounds, epochs=rounds // b)
        elif k == 1:
            C = dense.optimize(rounds)
        else:
            C = dense.optimize(rounds, bands=b, equal_norm=True)
        return np.tril(np.asarray(C, np.float64))


def dense_strategy(rounds: int, participation: Participation) -> Strategy:
    """An optimised dense C: fixed-epoch order for cyclic groups (b must divide the rounds),
    b-banded with equal column norms for min-separation (Choquette-Choo et al. 2023, Sec. 4),
    Denisov et al.'s for single."""
    if rounds > MAX_DENSE_ROUNDS:
        raise ValueError(
            f"dp.noise='dense' is for short runs (at most {MAX_DENSE_ROUNDS} rounds: its"
            " optimisation is cubic in the rounds and its stream keeps every draw), got"
            f" rounds={rounds}; use 'blt' or 'banded'"
        )
    b, k = participation.min_separation, participation.participations(rounds)
    if participation.scheme == "cyclic" and rounds % b:
        raise ValueError(
            "dp.noise='dense' with cyclic groups optimises fixed-epoch order:"
            f" sampling.min_separation={b} must divide rounds={rounds}"
        )
    C = _dense_matrix(rounds, participation.scheme, b, k)
    return Strategy("dense", rounds, dense_noising(np.linalg.inv(C)), rounds, dense_matrix=C)


def dense_noising(C_inverse: np.ndarray) -> streaming_matrix.StreamingMatrix:
    """C^{-1} (n x n lower triangular) streamed by keeping every draw: round t adds sum_{s <= t}
    C^{-1}[t, s] z_s."""
    rows = jnp.asarray(C_inverse, jnp.float32)
    n = rows.shape[0]

    def init(abstract_value):
        return jnp.zeros((), jnp.int32), jnp.zeros(
            (n,) + tuple(abstract_value.shape), abstract_value.dtype
        )

    def multiply_next(z, state):
        index, history = state
        history = history.at[index].set(z)
        noise = jnp.tensordot(rows[index], history, axes=1).astype(z.dtype)
        return noise, (index + 1, history)

    return streaming_matrix.StreamingMatrix.from_array_implementation(init, multiply_next)


def default_span(rounds: int, participation: Participation) -> int:
    """The default bands of ``banded`` and period of ``tree_restart``: the separation b, so a
    client's participations never share a band or a tree; single participation has no second round
    to keep apart, so the whole run."""
    return rounds if participation.scheme == "single" else min(participation.separation, rounds)


def build(
    name: str, rounds: int, participation: Participation, bands: int = 0, period: int = 0
) -> Strategy:
    """The strategy ``name`` for ``rounds`` rounds under ``participation`` (``bands`` for
    ``banded``, ``period`` for ``tree_restart``: 0 = the separation b, or the whole run under single
    participation)."""
    if name not in STRATEGIES:
        raise ValueError(f"dp.noise strategy {name!r} unknown; choose one of {STRATEGIES}")
    if name == "identity":
        return identity(rounds)
    if name in ("tree", "tree_restart", "tree_honaker"):
        if rounds > MAX_MATERIALIZED_ROUNDS:
            raise ValueError(
                f"dp.noise={name!r} is built for at most {MAX_MATERIALIZED_ROUNDS} rounds, got"
                f" {rounds}"
            )
        if name == "tree_restart":
            return tree_restart(rounds, period or default_span(rounds, participation))
        return tree(rounds) if name == "tree" else tree_honaker(rounds)
    if name == "banded":
        return banded(rounds, bands or default_span(rounds, participation))
    if name == "blt":
        return blt(rounds, participation)
    return dense_strategy(rounds, participation)
