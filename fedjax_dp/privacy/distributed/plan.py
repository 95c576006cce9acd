"""The parameters of a distributed-DP round, from the clip, the noise multiplier and the bit width
(Kairouz, Liu and Steinke 2021, Sec. 4; Agarwal, Kairouz and Liu 2021, Sec. 4):

* the noise: z is the multiplier of the central noise the surviving shares sum to, relative to the
  clip c: each of at least ``min_survivors`` n shares has std sigma = z c / sqrt(n) (unscaled), so
  the sum of the shares that survive carries at least the noise of std z c;
* gamma, the quantisation step, chosen so that ``k_stddevs`` standard deviations of the quantised,
  noised sum of the most clients a round holds, n_max, fit in the signed range of ``bits`` bits,
  assuming (as the papers do) every client's rotated update flat and the n_max updates aligned:
  2^bits gamma = 2 k sqrt(c^2 n_max^2 / D + n_max (gamma^2 / 4 + sigma^2)), solved in closed form;
  too few bits for n_max and k (2^(2 bits) <= k^2 n_max) are refused;
* in the scaled integer domain (divided by gamma) the clip is c / gamma, the rounded vectors are
  held to Delta_2 (``rounding.rounded_l2_bound``), Delta_1 follows, and each share's std (discrete
  Gaussian) or variance (Skellam) is sigma / gamma or (sigma / gamma)^2.

The round's event states the sensitivities and the noise of the n_min surviving shares; the
discrete Gaussian's inflation tau is computed for the n_max shares the sum may hold (it grows with
n), so the event bounds every round with between n_min and n_max survivors. A round with fewer
survivors than n_min is aborted as secure aggregation aborts below its threshold: nothing is
released and the model does not move (it is still accounted, conservatively).
"""

from __future__ import annotations

import dataclasses
import math

from fedjax_dp.privacy.distributed import rotation, rounding
from fedjax_dp.privacy.distributed.events import (
    DistributedDiscreteGaussianDpEvent,
    SkellamDpEvent,
)
from fedjax_dp.privacy.distributed.modular import MAX_BITS

MECHANISMS = ("ddgauss", "skellam")
SHARE_LIMITS = {"ddgauss": 2.0**19, "skellam": 2.0**27}
"""The largest share the samplers draw exactly (``discrete_noise``): a discrete Gaussian's std (its
draws, far into the tails, stay within float32's exact integers, 2^24), a Skellam variance (drawn
in at most 16 chunks of Poisson draws, ``poisson.POISSON_CHUNK``)."""
SHARE_NAMES = {"ddgauss": "std", "skellam": "variance"}
ROTATIONS = ("hadamard", "none")


def survivors_floor(expected: float, rate: float, dropout: float) -> int:
    """The default n_min: the expected survivors less three standard deviations (a client is
    sampled with probability ``rate`` and survives with 1 - ``dropout``), at least 1."""
    p = 1.0 - dropout
    mean = expected * p
    sd = math.sqrt(max(expected * p * (1 - rate * p), 0.0))
    return max(1, math.floor(mean - 3 * sd))


@dataclasses.dataclass(frozen=True)
class DistributedPlan:
    """mechanism, bits, beta, k_stddevs, the clip c, the noise multiplier z, the client vector's
    dimension d, n_min and n_max, and whether the vector is rotated."""

    mechanism: str
    bits: int
    beta: float
    k_stddevs: float
    clip_norm: float
    noise_multiplier: float
    dim: int
    min_survivors: int
    max_clients: int
    rotation: str = "hadamard"

    def __post_init__(self):
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"ddp.mechanism {self.mechanism!r} unknown; available: {MECHANISMS}")
        if not (isinstance(self.bits, int) and 2 <= self.bits <= MAX_BITS):
            raise ValueError(f"ddp.bits must be an integer in [2, {MAX_BITS}], got {self.bits!r}")
        if not 0 <= self.beta < 1:
            raise ValueError(f"ddp.beta must lie in [0, 1), got {self.beta}")
        if not self.k_stddevs > 0:
            raise ValueError(f"ddp.k_stddevs must be > 0, got {self.k_stddevs}")
        if self.rotation not in ROTATIONS:
            raise ValueError(f"ddp.rotation {self.rotation!r} unknown; available: {ROTATIONS}")
        if not 1 <= self.min_survivors <= self.max_clients:
            raise ValueError(
                f"ddp.min_survivors={self.min_survivors} must lie in [1, the most clients a round"
                f" holds = {self.max_clients}]"
            )
        if not self.noise_multiplier > 0:
            raise ValueError(f"distributed noise needs z > 0, got {self.noise_multiplier}")
        if 2.0 ** (2 * self.bits) <= self.k_stddevs**2 * self.max_clients:
            raise ValueError(
                f"ddp.bits={self.bits} is too few for {self.max_clients} clients at ddp.k_stddevs="
                f"{self.k_stddevs}: 2^(2 bits) must exceed k^2 n; raise ddp.bits or lower"
                " ddp.k_stddevs"
            )

        limit = SHARE_LIMITS[self.mechanism]
        if self.share_parameter() > limit:
            raise ValueError(
                f"ddp.mechanism={self.mechanism!r} at ddp.bits={self.bits}: a client's noise share"
                f" ({self.share_parameter():.4g}, its {SHARE_NAMES[self.mechanism]} in integer"
                f" units) exceeds {limit:.4g}, beyond what the float32 sampler draws exactly; use"
                " fewer bits"
            )

    @property
    def padded_dim(self) -> int:
        """D: the rotated vector's length (a power of two), or d without rotation."""
        return rotation.padded_dimension(self.dim) if self.rotation == "hadamard" else self.dim

    @property
    def local_std(self) -> float:
        """sigma: each share's std, unscaled."""
        return self.noise_multiplier * self.clip_norm / math.sqrt(self.min_survivors)

    @property
    def gamma(self) -> float:
        """The quantisation step (module docstring)."""
        c, n, k, sigma = self.clip_norm, self.max_clients, self.k_stddevs, self.local_std
        spread = c**2 * n**2 / self.padded_dim + n * sigma**2
        return 2 * k * math.sqrt(spread) / math.sqrt(2.0 ** (2 * self.bits) - k**2 * n)

    @property
    def scaled_std(self) -> float:
        """Each share's std in integer units."""
        return self.local_std / self.gamma

    @property
    def l2_sensitivity(self) -> float:
        """Delta_2 of a client's rounded vector (integer units)."""
        return rounding.rounded_l2_bound(self.clip_norm / self.gamma, self.beta, self.padded_dim)

    @property
    def l1_sensitivity(self) -> float:
        return rounding.rounded_l1_bound(self.l2_sensitivity, self.padded_dim)

    def event(self):
        """The round's accounting event (module docstring)."""
        if self.mechanism == "skellam":
            return SkellamDpEvent(
                self.l2_sensitivity,
                self.l1_sensitivity,
                self.min_survivors * self.scaled_std**2,
            )
        return DistributedDiscreteGaussianDpEvent(
            self.l2_sensitivity,
            self.l1_sensitivity,
            self.scaled_std,
            self.min_survivors,
            self.max_clients,
            self.padded_dim,
        )

    def share_parameter(self) -> float:
        """The sampler's argument (``discrete_noise.SAMPLERS``): the share's std or variance."""
        return self.scaled_std**2 if self.mechanism == "skellam" else self.scaled_std

    def describe(self) -> dict:
        return {
            "trust_model": "distributed: each client adds a share of discrete noise to its"
            " quantised, rotated update; a simulated secure aggregation (not cryptographic)"
            " reveals only the modular sum to the server",
            "ddp_mechanism": self.mechanism,
            "ddp_bits": self.bits,
            "ddp_beta": self.beta,
            "ddp_k_stddevs": self.k_stddevs,
            "ddp_rotation": self.rotation,
            "ddp_gamma": self.gamma,
            "ddp_padded_dim": self.padded_dim,
            "ddp_share_std_integer_units": self.scaled_std,
            "ddp_l2_sensitivity_integer_units": self.l2_sensitivity,
            "ddp_l1_sensitivity_integer_units": self.l1_sensitivity,
            "ddp_min_survivors": self.min_survivors,
            "ddp_max_clients": self.max_clients,
        }
