"""The noise plan of a correlated-noise run: a strategy C, the participation it is calibrated for,
and the noise multiplier z, with what follows from them (Choquette-Choo et al. 2023, Sec. 2; McMahan
et al. 2025, Sec. 4):

* the noise std of round t's iid draw Z_t is z * sens(C) * S (S: the clip), so that the whole
  release C x + Z is one Gaussian mechanism of multiplier z relative to its sensitivity;
* after t rounds (a run may stop early) the rounds released so far are C[:t, :t] x[:t] + Z[:t] (C is
  lower triangular), a Gaussian of multiplier z * sens(C) / sens(C[:t, :t]) (``event_through``): one
  event of the stream so far, never a composition of per-round events (the rounds' noise is
  correlated);
* amplified BandMF (``cyclic_poisson``): each client's group runs every b rounds and its members are
  Poisson sampled, so with a b-banded C of unit columns the stream is ceil(t / b) Poisson-subsampled
  Gaussians of multiplier z (jax_privacy's ``amplified_bandmf_event``);
* the error of the prefix sums: round t's prefix sum carries noise (A C^{-1})[t] Z, per coordinate
  of std z S sens(C) ||(A C^{-1})[t]|| (A: lower-triangular ones), reported as RMSE over the rounds
  and the largest.

sens(C[:t, :t]) is computed on a grid of t (every round for short runs); a round between grid points
uses the next grid point's value, an upper bound (sensitivity never falls as rounds are added), so
epsilon is never under-reported.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import dp_accounting
import jax
import numpy as np
from jax_privacy.experimental.accounting import amplified_bandmf_event
from jax_privacy.matrix_factorization import toeplitz

from fedjax_dp.privacy.correlated import soundness, strategies
from fedjax_dp.privacy.correlated.participation import Participation, sensitivity

# runs this short get sens(C[:t, :t]) for every t; longer ones a grid of ~48 points
EVERY_ROUND_UP_TO = 128


def sensitivity_grid(rounds: int) -> np.ndarray:
    if rounds <= EVERY_ROUND_UP_TO:
        return np.arange(1, rounds + 1)
    grid = np.unique(np.round(np.geomspace(EVERY_ROUND_UP_TO // 4, rounds, 48)).astype(int))
    return np.unique(np.concatenate([np.arange(1, EVERY_ROUND_UP_TO // 4), grid, [rounds]]))


def prefix_sensitivity(
    strategy: strategies.Strategy, participation: Participation, t: int
) -> float:
    """sens(C[:t, :t]) under ``participation`` (exact closed forms where they hold, else
    jax_privacy's bound)."""
    k = participation.participations(t)
    if participation.amplified:
        return float(np.linalg.norm(strategy.matrix(t), axis=0).max())
    if strategy.bands is not None and (
        participation.scheme == "single" or strategy.bands <= participation.separation
    ):
        # columns of unit norm (at most) with disjoint supports across participations b >= bands
        # apart
        if strategy.name == "identity" or strategy.column_normalized:
            return math.sqrt(k)
    # C itself Toeplitz
    toeplitz_c = strategy.toeplitz_coef is not None and not strategy.column_normalized
    if toeplitz_c and participation.scheme != "cyclic":
        b = 1 if participation.scheme == "single" else participation.min_separation
        coef = np.zeros(t)
        coef[: min(t, len(strategy.toeplitz_coef))] = strategy.toeplitz_coef[:t]
        # jax_privacy's exact Toeplitz bound (Thm. 2 of
        if np.all(coef >= 0) and np.all(np.diff(coef) <= 0):
            # Kalinin and Lampert 2024) holds for non-negative, non-increasing coef
            with jax.enable_x64(True):
                return float(math.sqrt(toeplitz.minsep_sensitivity_squared(coef, b, k, n=t)))
    return sensitivity(strategy.matrix(t), participation)


@dataclasses.dataclass(frozen=True, eq=False)
class NoisePlan:
    """strategy, participation, z (the noise multiplier of the whole stream, relative to its
    sensitivity)."""

    strategy: strategies.Strategy
    participation: Participation
    noise_multiplier: float

    def __post_init__(self):
        if not self.noise_multiplier > 0 or not math.isfinite(self.noise_multiplier):
            raise ValueError(
                f"correlated noise needs a noise multiplier z > 0, got {self.noise_multiplier}"
            )
        strategy = self.strategy
        soundness.check(
            strategy.name,
            strategy.rounds,
            self.participation,
            bands=strategy.bands if strategy.name == "banded" else 0,
            period=strategy.period or 0,
        )

    @property
    def rounds(self) -> int:
        return self.strategy.rounds

    @functools.cached_property
    def grid(self) -> np.ndarray:
        return sensitivity_grid(self.rounds)

    @functools.cached_property
    def sensitivities(self) -> np.ndarray:
        """sens(C[:g, :g]) at each grid point g."""
        return np.array(
            [prefix_sensitivity(self.strategy, self.participation, int(g)) for g in self.grid]
        )

    @property
    def sensitivity(self) -> float:
        """sens(C) for the whole run, which the noise std is scaled by."""
        return float(self.sensitivities[-1])

    @property
    def std_over_clip(self) -> float:
        """The std of each round's iid draw Z_t over the clip S: z * sens(C)."""
        return self.noise_multiplier * self.sensitivity

    def sensitivity_through(self, t: int) -> float:
        """An upper bound on sens(C[:t, :t]): the value at the first grid point >= t."""
        if not 1 <= t <= self.rounds:
            raise ValueError(
                f"round {t} is outside the {self.rounds} rounds the noise strategy is built for"
            )
        return float(self.sensitivities[np.searchsorted(self.grid, t)])

    def event_through(self, t: int) -> dp_accounting.DpEvent:
        """The stream of rounds 1..t as one event (module docstring)."""
        z = self.noise_multiplier
        if not self.participation.amplified:  # z sens(C) / sens(C[:t, :t])
            z = z * self.sensitivity / self.sensitivity_through(t)
        return stream_event(self.participation, z, t)

    @functools.cached_property
    def prefix_errors(self) -> np.ndarray | None:
        """||B[t]|| (A = B C) for every round t (in units of the iid draw's std), or None for runs
        too long to materialise."""
        n = self.rounds
        if n > strategies.MAX_MATERIALIZED_ROUNDS:
            return None
        if self.strategy.name == "identity":
            return np.sqrt(np.arange(1, n + 1, dtype=float))
        return np.linalg.norm(self.strategy.decoder(), axis=1)

    def error(self) -> dict:
        """The prefix sums' noise per coordinate, over z S (so comparable across strategies at one
        z)."""
        errors = self.prefix_errors
        if errors is None:
            return {}
        scale = self.sensitivity
        return {
            "prefix_sum_rmse_over_z_clip": float(scale * np.sqrt(np.mean(errors**2))),
            "prefix_sum_max_error_over_z_clip": float(scale * errors.max()),
        }


def stream_event(
    participation: Participation, noise_multiplier: float, t: int
) -> dp_accounting.DpEvent:
    """The stream of rounds 1..t as one event: the Gaussian of its multiplier (z sens(C) /
    sens(C[:t, :t]); z after the strategy's last round), or for amplified BandMF ceil(t / b)
    Poisson-sampled Gaussian rounds of multiplier z (jax_privacy's ``amplified_bandmf_event``;
    module docstring)."""
    if participation.amplified:
        return amplified_bandmf_event(
            noise_multiplier,
            t,
            num_bands=participation.min_separation,
            sampling_prob=participation.rate,
        )
    return dp_accounting.GaussianDpEvent(noise_multiplier)


def stream_parts(event: dp_accounting.DpEvent) -> tuple[float, int]:
    """(multiplier, count) of a stream's event: a Gaussian, or amplified BandMF's self-composed
    Poisson-sampled Gaussian rounds (nan where it is neither)."""
    count = 1
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        event, count = event.event, event.count
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        event = event.event
    z = event.noise_multiplier if isinstance(event, dp_accounting.GaussianDpEvent) else np.nan
    return float(z), int(count)
