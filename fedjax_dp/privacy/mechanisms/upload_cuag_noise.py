"""CUAG-PFL's adaptive Gaussian DP noise (seed 004, Alg. 4) as upload transforms, in both modes of
``privacy.mechanisms.adaptive_gdp``.

``paper``: ``CuagPaperNoise``, Alg. 4 as written: each client adds N(0, (2 C_l sigma_t / B)^2) to
every layer l of its (compressed) upload with C_l = ||layer l|| and the paper's sigma_t schedule. NO
formal guarantee (the threshold is the layer's own norm: no finite sensitivity): its release is
labelled ``formal=False``. It carries the paper's per-round CLT figure without the client rate
lambda (lambda = 1 in q): conditioned on a client taking part, its ledger composes these over the
rounds it ran, so lambda's amplification is not counted twice. The run's headline figure is the
paper's formula as the paper states it, lambda included, over the rounds run
(``adaptive_gdp.rounds_mu``; the tracker reports it). Neither is a guarantee.

``sound``: ``cuag_sound_noise``: the same structure with fixed per-layer thresholds C_l and local
Gaussian noise z sqrt(sum_l C_l^2) on every entry: a per-layer clip followed by local Gaussian
noise, both already transforms, so the chain and the ledger account it like any local-DP run. Alg.
4's own noise at a fixed C (std 2 C sigma_t / B, Table 5's fixed-C cells) is this with
``alg4_multipliers``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import rng, tree
from fedjax_dp.core.uploads import (
    UNBOUNDED,
    BoundMapping,
    Claim,
    ClientContext,
    Flow,
    KeyDrawing,
    Release,
    Scheduled,
    UploadTransform,
)
from fedjax_dp.privacy.mechanisms import adaptive_gdp
from fedjax_dp.privacy.mechanisms.upload_clipping import PerLayerClip
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise


@dataclasses.dataclass(frozen=True, kw_only=True)  # by name only: no float can take another's place
class CuagPaperNoise(Scheduled, BoundMapping, KeyDrawing, UploadTransform):
    """Alg. 4 as written; ``mu`` the paper's GDP target, the rest its sigma_t setting."""

    kind: ClassVar[str] = "noise"
    local: ClassVar[bool] = True
    # scales to each layer's own norm: no clip before it
    calibrated_to_bound: ClassVar[bool] = False
    mu: float = 0.25
    sampling_rate: float = 0.1  # lambda
    batch_size: int = 50  # B
    dataset_size: int = 500  # |D|, a client's local examples
    local_steps: int = 25  # P
    client_mus: tuple | None = None  # heterogeneous DP: mu_n per population client (Table 8)
    client_sizes: tuple | None = None  # |D_n| per population client (else ``dataset_size`` for all)
    # > 0: Alg. 4's sigma held fixed instead of the sigma_t schedule (Table 5)
    fixed_sigma: float = 0.0
    # the noise-scale sweep: every sigma (fixed or sigma_t) times this factor
    sigma_scale: float = 1.0
    # > 0: the paper's claim for the whole run (where sigma follows the schedule made for it)
    claimed_mu: float = 0.0
    claim_note: str = ""  # what privacy.json says of the paper's figures
    details: tuple = ()  # (key, value) pairs for privacy.json's accounting

    def __post_init__(self):
        if not (self.sigma_scale > 0 and np.isfinite(self.sigma_scale)):
            raise ValueError(
                f"the sigma scale must be a finite number > 0, got {self.sigma_scale!r}"
            )
        if not (self.fixed_sigma >= 0 and np.isfinite(self.fixed_sigma)):
            raise ValueError(
                f"a fixed Alg. 4 sigma must be a finite number >= 0, got {self.fixed_sigma!r}"
            )
        for mu, size in self._clients():
            adaptive_gdp.noise_scale(1, mu, **self.setting(size))  # validates every field by name
        # the builder's line, past the generated __init__
        warnings.warn(adaptive_gdp.PAPER_MODE_NOTE, stacklevel=3)

    @property
    def per_client(self) -> bool:
        return self.client_mus is not None or self.client_sizes is not None

    def _clients(self) -> list[tuple[float, int]]:
        """(mu_n, |D_n|) per population client (one pair for all when not per client)."""
        if not self.per_client:
            return [(self.mu, self.dataset_size)]
        n = len(self.client_mus if self.client_mus is not None else self.client_sizes)
        mus = self.client_mus if self.client_mus is not None else (self.mu,) * n
        sizes = self.client_sizes if self.client_sizes is not None else (self.dataset_size,) * n
        if len(mus) != len(sizes):
            raise ValueError(f"{len(mus)} per-client mu values for {len(sizes)} client sizes")
        return list(zip(mus, sizes))

    def setting(self, dataset_size: int | None = None, participating: bool = False) -> dict:
        """Alg. 4's setting for a client of ``dataset_size`` examples; ``participating``: lambda = 1
        (conditioned on the client taking part)."""
        return dict(
            sampling_rate=1.0 if participating else self.sampling_rate,
            batch_size=self.batch_size,
            dataset_size=self.dataset_size if dataset_size is None else int(dataset_size),
            local_steps=self.local_steps,
        )

    def _sigmas(self, round_index: int) -> list[float]:
        if self.fixed_sigma:
            return [float(self.fixed_sigma) * self.sigma_scale] * len(self._clients())
        return [
            adaptive_gdp.noise_scale(round_index, mu, **self.setting(size)) * self.sigma_scale
            for mu, size in self._clients()
        ]

    def inputs(self, round_index: int) -> dict:
        sigmas = self._sigmas(round_index)
        return {"sigma": np.asarray(sigmas, np.float32) if self.per_client else sigmas[0]}

    def bound_after(self, bound, state, inputs):
        return jnp.float32(UNBOUNDED)  # noise proportional to the layer's own norm bounds nothing

    def client(self, upload, ctx: ClientContext) -> Flow:
        sigma = ctx.inputs["sigma"][ctx.client_id] if self.per_client else ctx.inputs["sigma"]
        noised = adaptive_gdp.paper_perturb(upload, ctx.noise_key, sigma, self.batch_size)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, upload)
        return Flow(tree.where(ctx.present, noised, zeros), jnp.float32(UNBOUNDED))

    def key_uses(self) -> tuple:
        return (rng.Purpose.CLIENT_NOISE,)

    def releases(self, inputs: dict, bound: float = math.nan) -> tuple[Release, ...]:
        sigmas = np.atleast_1d(np.asarray(inputs["sigma"], float))
        mu_t = np.array(
            [
                adaptive_gdp.formula_mu(float(sigma), 1, **self.setting(size, participating=True))
                for sigma, (_, size) in zip(sigmas, self._clients())
            ]
        )
        # The ledger composes (2 / z)^2 per participation under local noise (replace-one): z = 2 /
        # mu_t makes it
        # compose the paper's per-round figure, lambda = 1 (the client took part), over the rounds
        # each client ran.
        z = 2.0 / mu_t
        figure = (
            f"mu_t = {mu_t[0]:.6g}"
            if len(mu_t) == 1
            else f"mu_t in [{mu_t.min():.6g}, {mu_t.max():.6g}] per client"
        )
        stated = self.paper_round_mu_squared(sigmas)  # the paper's own figure, lambda inside q
        formula = Claim(
            "paper_formula",
            mu_squared=tuple(stated.tolist()) if self.per_client else float(stated[0]),
            headline=True,
            note=self.claim_note,
        )
        claims = (formula,) + (
            (Claim("paper_claim", mu=self.claimed_mu),) if self.claimed_mu else ()
        )
        return (
            Release(
                "CUAG-PFL adaptive GDP noise, paper mode (Alg. 4)",
                "local",
                float(z.min()),
                "none: C_l = ||layer l|| (the layer's own norm)",
                formal=False,
                note=adaptive_gdp.PAPER_MODE_NOTE
                + " Per-round CLT figure of the paper for a client that "
                f"takes part (lambda = 1): {figure}.",
                bound_value=math.inf,
                claims=claims,
                details=dict(self.details) or None,
                client_multipliers=tuple(float(v) for v in z) if self.per_client else None,
            ),
        )

    def paper_round_mu_squared(self, sigmas) -> np.ndarray:
        """The paper's one-round mu_t^2 as it states it (lambda inside q) at the round's ``sigmas``,
        per (mu_n, |D_n|): summed over the rounds run it is ``adaptive_gdp.rounds_mu``^2, the
        paper's figure (the run's headline under ``formal: false``; not a guarantee)."""
        sigmas = np.atleast_1d(np.asarray(sigmas, float))
        return np.array(
            [
                adaptive_gdp.formula_mu(float(sigma), 1, **self.setting(size)) ** 2
                for sigma, (_, size) in zip(sigmas, self._clients())
            ]
        )


def cuag_sound_noise(
    layer_norms: tuple[float, ...],
    schedule: tuple,
    client_multipliers: tuple | None = None,
    clip: UploadTransform | None = None,
) -> tuple[UploadTransform, ...]:
    """The sound mode: per-layer thresholds C_l (fixed, or ``clip``: a per-layer adaptive clip),
    then local N(0, (z_t sqrt(sum C_l^2))^2) per entry (``schedule``: ((first round, z_t), ...);
    ``client_multipliers``: z_n per population client, heterogeneous DP)."""
    return clip or PerLayerClip(tuple(layer_norms)), GaussianNoise(
        tuple(schedule), local=True, client_multipliers=client_multipliers
    )


def alg4_multipliers(sigmas, batch_size: int, layers: int) -> tuple:
    """Alg. 4's noise N(0, (2 C sigma_t / B)^2) per entry as the multiplier of a clip at C on each
    of L layers (sensitivity C sqrt(L)): z_t = 2 sigma_t / (B sqrt(L)). ``sigmas``: sigma_t for t =
    1, 2, ...; returns the piecewise-constant schedule ((first round, z_t), ...)."""
    return piecewise_schedule(np.asarray(sigmas, float) * 2.0 / (batch_size * np.sqrt(layers)))


def piecewise_schedule(values) -> tuple:
    """((first round, value), ...) of per-round ``values`` (round t = index + 1), one entry per
    change."""
    schedule = []
    for t, value in enumerate(np.asarray(values, float).tolist(), start=1):
        if not schedule or schedule[-1][1] != value:
            schedule.append((t, value))
    return tuple(schedule)
