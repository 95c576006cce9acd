"""Client participation schemes that a correlated-noise mechanism is calibrated for, and the L2
sensitivity of a strategy matrix C under each (Choquette-Choo et al. 2023, "(Amplified) Banded
Matrix Factorization", Sec. 2-4; jax_privacy's ``matrix_factorization.sensitivity``).

The release of rounds 1..n is C x + Z (equivalently x + C^{-1} Z, the noise the server adds) with x
the stream of clipped sums and Z iid Gaussian. A client whose clipped contribution (norm <= 1 in
units of the clip S) enters the rounds pi changes C x by sum_{t in pi} C[:, t] u_t, of squared norm
sum_{i,j in pi} X_ij <u_i, u_j> <= sum_{i,j in pi} |X_ij| with X = C^T C (exact where X >= 0). The
sensitivity is the largest over the patterns pi the scheme allows:

* ``min_separation`` (b, k): any rounds at least b apart (j - i >= b), at most k of them (what a
  sampler can enforce when clients check in when idle, charging and on Wi-Fi: Kairouz et al. 2021;
  Gboard's DP-FTRL);
* ``single``: at most one round (k = 1);
* ``cyclic`` (b): the population split into b fixed groups taken in turn, group g in rounds g, g +
  b, ...;
* ``cyclic_poisson`` (b, q): cyclic groups, each member of the round's group sampled with
  probability q: the amplified BandMF of Choquette-Choo et al. 2023 (banded strategies with at most
  b bands only; sensitivity is then the largest column norm and the privacy comes from the sampling,
  ``privacy.ledgers.correlated``).

The neighbouring relation is zero-out: the participation schedule (who checks in when) is the same
in both worlds and one client's data is replaced by a null contribution (jax_privacy's
REPLACE_SPECIAL); for the sum of clipped uploads with a fixed denominator that is the same output
distribution as removing the client.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

SCHEMES = ("min_separation", "single", "cyclic", "cyclic_poisson")


@dataclasses.dataclass(frozen=True)
class Participation:
    """scheme: one of ``SCHEMES``. min_separation: b (rounds between two participations of one
    client; the number of groups for the cyclic schemes). max_participations: k (0: as many as b and
    the run's rounds allow). rate: q for ``cyclic_poisson`` (the chance a member of the round's
    group takes part)."""

    scheme: str
    min_separation: int = 1
    max_participations: int = 0
    rate: float = 1.0

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise ValueError(
                f"participation scheme {self.scheme!r} unknown; choose one of {SCHEMES}"
            )
        if not (isinstance(self.min_separation, int) and self.min_separation >= 1):
            raise ValueError(
                f"min_separation b must be an integer >= 1, got {self.min_separation!r}"
            )
        if not (isinstance(self.max_participations, int) and self.max_participations >= 0):
            raise ValueError(
                "max_participations k must be an integer >= 0 (0: no limit), got"
                f" {self.max_participations!r}"
            )
        if not 0 < self.rate <= 1:
            raise ValueError(f"participation rate q must lie in (0, 1], got {self.rate}")

    @property
    def separation(self) -> int:
        """The least gap between two rounds of one client (single participation: no second
        round)."""
        return self.min_separation

    @property
    def amplified(self) -> bool:
        return self.scheme == "cyclic_poisson"

    def participations(self, rounds: int) -> int:
        """The most rounds of ``rounds`` one client can take part in."""
        if self.scheme == "single":
            return min(1, rounds)
        most = -(-rounds // self.min_separation)
        if self.scheme == "min_separation" and self.max_participations:
            return min(most, self.max_participations)
        return most

    def describe(self) -> str:
        if self.scheme == "single":
            return "single participation (each client at most once)"
        if self.scheme == "min_separation":
            k = (
                f"at most {self.max_participations} times"
                if self.max_participations
                else "no limit on the count"
            )
            return f"{self.min_separation}-min-separation ({k})"
        if self.scheme == "cyclic":
            return f"cyclic: {self.min_separation} fixed groups in turn"
        return (
            f"cyclic Poisson: {self.min_separation} fixed groups in turn, each member sampled with"
            f" q = {self.rate:g}"
        )

    def patterns(self, rounds: int) -> list[np.ndarray]:
        """Every participation pattern of a client over ``rounds`` rounds (0-based round indices),
        for a brute-force check on small runs (``min_separation`` enumerates all subsets:
        exponential, tests only)."""
        if self.scheme in ("cyclic", "cyclic_poisson"):
            return [
                np.arange(g, rounds, self.min_separation)
                for g in range(min(self.min_separation, rounds))
            ]
        k = self.participations(rounds)
        out = []

        def extend(prefix, start):
            if prefix:
                out.append(np.asarray(prefix))
            if len(prefix) == k:
                return
            for t in range(start, rounds):
                extend(prefix + [t], t + self.min_separation)

        extend([], 0)
        return out


def sensitivity(C: np.ndarray, participation: Participation) -> float:
    """The L2 sensitivity of the strategy ``C`` (releases x n rounds: lower triangular n x n, or a
    tree's nodes) under ``participation`` (module docstring): exact for cyclic patterns and where
    C^T C >= 0, an upper bound otherwise (jax_privacy's Algorithm 4 of Choquette-Choo et al. 2023
    for min-separation)."""
    import jax
    from jax_privacy.matrix_factorization import sensitivity as mf_sensitivity

    C = np.asarray(C, np.float64)
    n = C.shape[1]  # rounds (C is rounds x rounds, or nodes x rounds for Honaker's tree)
    if participation.amplified:  # privacy from the sampling: the per-participation norm
        check_banded(C, participation.min_separation)
        return float(np.linalg.norm(C, axis=0).max())
    X = C.T @ C
    if participation.scheme == "cyclic":
        return float(
            math.sqrt(max(np.abs(X[np.ix_(p, p)]).sum() for p in participation.patterns(n)))
        )
    k = participation.participations(n)
    if k == 1:
        return float(np.linalg.norm(C, axis=0).max())
    with jax.enable_x64(True):
        return float(
            mf_sensitivity.get_min_sep_sensitivity_upper_bound_for_X(
                X, participation.min_separation, k
            )
        )


def brute_force_sensitivity(C: np.ndarray, participation: Participation) -> float:
    """max over the scheme's patterns pi of sqrt(sum_{i,j in pi} |X_ij|): the definition, for small
    n (tests)."""
    C = np.asarray(C, np.float64)
    X = np.abs(C.T @ C)
    return float(math.sqrt(max(X[np.ix_(p, p)].sum() for p in participation.patterns(C.shape[1]))))


def check_banded(C: np.ndarray, bands: int) -> None:
    """Refuses a C that is not lower triangular with at most ``bands`` bands: amplified BandMF's
    sensitivity (the largest column norm, privacy from the sampling) holds for those only
    (Choquette-Choo et al. 2023, Sec. 4)."""
    C = np.asarray(C)
    rows, cols = np.nonzero(C)
    if C.shape[0] != C.shape[1] or np.any(rows - cols >= bands) or np.any(rows < cols):
        raise ValueError(
            f"cyclic Poisson participation (amplified BandMF) needs a lower-triangular C of at"
            f" most {bands} bands; this {C.shape[0]} x {C.shape[1]} C is not"
        )
