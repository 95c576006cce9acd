"""Adaptive Gaussian DP noise of CUAG-PFL (seed 004, Alg. 4; ALGORITHMS.md §4), as written and
sound.

The paper, per layer l of a client's compressed upload in round t (P local steps, batch B, local
data
|D|, client sampling rate lambda):
    sigma_t = sqrt(1 / ln(mu^2 |D|^2 / (4 lambda^2 B^2 t P) + 1)),   C_l = ||compressed layer l||_2,
    upload_l + N(0, (2 C_l sigma_t / B)^2 I),
and claims mu-GDP by the central limit theorem with mu = (2 lambda B / |D|) sqrt(t P (e^{1/sigma^2}
- 1)), converted to (epsilon, delta) exactly (``gdp.epsilon_from_mu``; mu = 0.25 -> epsilon 0.92 at
  1e-5).

Two things are wrong with that claim, and this module says both:
* ``paper`` mode (implemented exactly as written): clipping a layer at its own norm bounds nothing.
  The noise grows with the update, so the signal-to-noise ratio of every upload is B / (2 sigma_t)
  whatever the client sends: there is no finite sensitivity and NO formal DP guarantee. The privacy
  audit (``audit.cuag_round``) measures epsilon lower bounds far above the claim.
* the schedule: sigma_t is chosen so that plugging t into the formula gives mu, but the rounds
  compose. Under the same CLT the per-round mu_t^2 = mu^2 / t add up, so T rounds spend
  mu sqrt(H_T) (H_T the T-th harmonic number; 2.5 mu for T = 300), not mu (``schedule_mu``).

Both run as upload transforms (``upload_cuag_noise``): ``CuagPaperNoise`` calls ``paper_perturb``;
the sound mode is a per-layer clip and local Gaussian noise. ``sound`` mode keeps the structure
(per-layer thresholds, Gaussian noise on the compressed upload) with fixed thresholds C_l: the
clipped upload has L2 sensitivity sqrt(sum_l C_l^2) and the noise std is z sqrt(sum_l C_l^2) per
client; the noise is local, so two neighbouring clients' uploads (replace-one) differ by at most 2
sqrt(sum_l C_l^2), and each client's ledger composes (2 / z)^2 per participation.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy.mechanisms.gaussian import gaussian_noise_like

PAPER_MODE_NOTE = (
    "CUAG-PFL 'paper' mode clips each layer at its own norm (C_l = ||layer||), which bounds"
    " nothing: the upload has no finite sensitivity and carries NO formal differential-privacy"
    " guarantee. The mu and epsilon reported for it are the paper's CLT formula, not a guarantee;"
    " use mode 'sound' for one."
)


def _check_positive(**values):
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def example_sampling_rate(sampling_rate: float, batch_size: int, dataset_size: int) -> float:
    """The paper's q = 2 lambda B / |D| (client rate lambda times twice the batch fraction)."""
    _check_positive(sampling_rate=sampling_rate, batch_size=batch_size, dataset_size=dataset_size)
    return 2 * sampling_rate * batch_size / dataset_size


def noise_scale(
    round_index: int,
    mu: float,
    *,
    sampling_rate: float,
    batch_size: int,
    dataset_size: int,
    local_steps: int,
) -> float:
    """sigma_t of Alg. 4 for round ``round_index`` = t >= 1."""
    _check_positive(mu=mu, local_steps=local_steps)
    if not (isinstance(round_index, int) and round_index >= 1):
        raise ValueError(f"CUAG rounds are numbered from t = 1, got {round_index!r}")
    q = example_sampling_rate(sampling_rate, batch_size, dataset_size)
    return math.sqrt(1.0 / math.log1p(mu**2 / (q**2 * round_index * local_steps)))


def formula_mu(
    sigma: float,
    round_index: int,
    *,
    sampling_rate: float,
    batch_size: int,
    dataset_size: int,
    local_steps: int,
) -> float:
    """The paper's claimed mu = q sqrt(t P (e^{1/sigma^2} - 1)); at sigma = sigma_t it returns
    mu."""
    _check_positive(sigma=sigma, local_steps=local_steps)
    q = example_sampling_rate(sampling_rate, batch_size, dataset_size)
    return q * math.sqrt(round_index * local_steps * math.expm1(sigma**-2))


def schedule_mu(rounds: int, mu: float, **setting) -> float:
    """The CLT mu of the schedule actually run: sqrt(sum_t mu_t^2) with mu_t the one-round mu at
    sigma_t (= mu sqrt(H_T)). Still the paper's example-level CLT figure: meaningful only in
    ``sound`` terms."""
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    return rounds_mu([noise_scale(t, mu, **setting) for t in range(1, rounds + 1)], **setting)


def rounds_mu(sigmas, **setting) -> float:
    """The paper's formula over the rounds run at ``sigmas`` (one sigma per round): sqrt(sum_t
    mu_t^2), mu_t the one-round mu = q sqrt(P (e^{1/sigma_t^2} - 1)) with the client rate lambda
    inside q, as the paper states it (``schedule_mu`` for Alg. 4's sigma_t; sqrt(T) mu_1 for a sigma
    held fixed). Not a guarantee."""
    return math.sqrt(sum(formula_mu(float(sigma), 1, **setting) ** 2 for sigma in sigmas))


def paper_claim(rounds: int, mu: float, delta: float, **setting) -> dict:
    """What a ``paper``-mode run must record: the claimed epsilon, the schedule's, and that neither
    is a guarantee."""
    mu_run = schedule_mu(rounds, mu, **setting)
    return {
        "mode": "paper",
        "formal_guarantee": False,
        "note": PAPER_MODE_NOTE,
        "mu_claimed": mu,
        "epsilon_claimed": gdp.epsilon_from_mu(mu, delta),
        "mu_schedule_clt": mu_run,
        "epsilon_schedule_clt": gdp.epsilon_from_mu(mu_run, delta),
        "delta": delta,
        "rounds": rounds,
    }


def paper_perturb(layers, key: jax.Array, sigma: float | jax.Array, batch_size: int):
    """Alg. 4 as written: layer_l + N(0, (2 ||layer_l|| sigma / B)^2). NO formal guarantee (module
    doc)."""
    _check_positive(batch_size=batch_size)
    unit = gaussian_noise_like(layers, 1.0, key)
    return jax.tree_util.tree_map(
        lambda x, n: x + (2.0 * sigma / batch_size) * jnp.sqrt(jnp.sum(jnp.square(x))) * n,
        layers,
        unit,
    )
