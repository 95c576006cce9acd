"""UDP, user-level DP (Wei, Li, Ding, Ma, Su, Zhang, Poor 2022, "User-Level Privacy-Preserving
Federated
Learning: Analysis and Performance Optimization", IEEE TMC; arXiv 2003.00229), a non-personalised
CUAG-PFL baseline (seed 004 §7.2.3 item 2, §7.2.4; ALGORITHMS.md §4): client-level local Gaussian DP
with a FIXED privacy budget epsilon (seed 004: 10 at delta 1e-5), the noise adapting per round so
that it grows with the rounds (seed 004 Fig. 4b).

FedAvg's client (``fedavg``) uploads Delta w_n through ``chain(clip(C), local Gaussian, uniform
mean)`` (the clip fixed: seed 004 fixes it to 1 for every LDP method; its prose mentions an adaptive
clip for UDP without defining it). ``udp.mode``:

* ``paper`` (a reading, stated: the seed gives no formula): Wei et al.'s calibration of record-level
  LDP for the rounds run so far. Their sensitivity of a client's trained model to one of its m
  records is Delta s = 2C / m (as in their NbAFL, Wei et al. 2020, IEEE TIFS, Lemma 1), and round t
  adds N(0, sigma_t^2 I) with
      sigma_t = c Delta s sqrt(t) / epsilon,  c = sqrt(2 ln(1.25 / delta))
  (their sigma = c Delta s sqrt(T) / epsilon for T exposures, taken at the current round t), i.e. a
  multiplier z_t = sigma_t / C = 2 c sqrt(t) / (epsilon m) of the clip, m the mean client data size.
  NO formal guarantee: 2C / m bounds one record's effect on a single mean of per-example-clipped
  gradients, not on E epochs of local SGD with the update clipped once (one record can move that
  update by up to 2C). The run records the composition of the paper's own figures (sensitivity 2C /
  m: (2 / (z_t m))^2 = (epsilon / c)^2 / t per participation, GDP-exact) with ``formal: false``,
  beside the claim ``epsilons.paper_claim``; even by those figures the classical calibration (valid
  for epsilon <= 1 only, Dwork and Roth 2014, Thm. A.1) lets a client spend more than the claim (a
  single participation in round 1 spends 10.39 at epsilon = 10), and ``epsilons.clients_over_claim``
  counts them.
* ``sound``: client-level LDP (replace-one client data, sensitivity 2C, a formal guarantee) with the
  same growth, z_t = kappa sqrt(t), kappa calibrated to the client's GDP budget mu(epsilon, delta)
  so that ANY K participations spend at most it (``udp.participations``, 0 = ceil(lambda T);
  ``privacy.accounting.calibration.worst_case_multipliers``: kappa = (2 / mu) sqrt(H_K), the
  first K rounds being the costliest). Calibrating to the expected cost instead would price a
  first-round participation above the whole budget whenever K < T / H_T (always, at lambda = 0.1),
  and no client could take part. Each client's ledger holds epsilon as its budget and a client whose
  next participation would exceed it is no longer sampled, so no client ever spends more than
  epsilon. The noise is far above the paper's (client- instead of record-level sensitivity).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core.uploads import Claim, Release, UniformWeights, chain
from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy import sampling, settings
from fedjax_dp.privacy.accounting.calibration import (
    classical_gaussian_multiplier,
    expected_participations,
    worst_case_multipliers,
)
from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip
from fedjax_dp.privacy.mechanisms.upload_cuag_noise import piecewise_schedule
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise

MODES = ("paper", "sound")


def udp_multipliers(rounds: int, epsilon: float, delta: float, records: float) -> tuple:
    """((t, z_t), ...) for t = 1..rounds: z_t = 2 c sqrt(t) / (epsilon m), c = sqrt(2 ln(1.25 /
    delta)): the classical Gaussian calibration of sensitivity 2 sqrt(t) / m over epsilon
    (``calibration.classical_gaussian_multiplier``)."""
    return tuple(
        (t, classical_gaussian_multiplier(epsilon, delta, 2.0 * math.sqrt(t) / records))
        for t in range(1, rounds + 1)
    )


@dataclasses.dataclass(frozen=True)
class UdpPaperNoise(GaussianNoise):
    """The paper mode's local noise z_t C (``GaussianNoise``), released with the paper's own figure:
    the multiplier relative to its claimed record-level bound C / m, ``formal=False``."""

    records: float = 1.0  # m: the clients' (mean) data size in Delta s = 2C / m

    def releases(self, inputs: dict, bound: float = math.nan) -> tuple[Release, ...]:
        return (
            Release(
                "UDP local Gaussian noise, paper calibration (Wei et al.)",
                "local",
                float(inputs["z"]) * self.records,
                f"claimed: C / m per record (Delta s = 2C / m, m = {self.records:g}); not a bound"
                " of multi-step local training",
                formal=False,
                bound_value=bound / self.records,
                claims=tuple(self.claims),
                note=(
                    "the paper's record-level sensitivity 2C / m assumes one mean of"
                    " per-example-clipped gradients; E epochs of local SGD clipped once are bounded"
                    " only at the client level"
                ),
            ),
        )


def sound_multipliers(cfg, num_clients: int) -> tuple:
    """z_t = kappa sqrt(t): any K planned participations spend at most mu(udp.epsilon,
    privacy.delta)."""
    u = cfg.udp
    rate = sampling.build(cfg.sampling, num_clients).rate_at(1)
    participations = expected_participations(rate, cfg.rounds, u.participations)
    return piecewise_schedule(
        worst_case_multipliers(
            np.sqrt(np.arange(1, cfg.rounds + 1)),
            gdp.mu_from_epsilon(u.epsilon, cfg.privacy.delta),
            participations,
        )
    )


def paper_claim(epsilon: float, sound: bool) -> Claim:
    """The paper's claim, epsilon for every client at any round, and what the run's epsilons are
    beside it."""
    return Claim(
        "paper_claim",
        epsilon=float(epsilon),
        note=(
            f"UDP: the paper claims epsilon = {epsilon:g} for every client at any round"
            " (epsilons.paper_claim); the epsilons listed are the exact composition of the"
            " participations each client ran"
            + (
                "; sound mode: the noise is calibrated to it and a client whose next participation"
                " would exceed it is no longer sampled"
                if sound
                else (
                    "; paper mode (as written): NO formal guarantee, the epsilons are the"
                    " composition of the paper's record-level figures (sensitivity 2C / m); the"
                    " claim is not enforced and its calibration holds for epsilon <= 1 only:"
                    " epsilons.clients_over_claim counts the clients that spent more than the claim"
                    " even by those figures"
                )
            )
        ),
    )


def build_udp(ctx) -> tuple:
    cfg, u = ctx.cfg, ctx.cfg.udp
    algorithm = FedAvg(
        ctx.model.per_example_loss,
        ctx.client_optimizer(),
        **ctx.client_fields(),
        deferred_dense_rate=ctx.deferred_dense_rate(),
    )
    if u.mode == "paper":
        if not ctx.client_sizes:
            raise ValueError(
                "udp.mode='paper' calibrates to the clients' data size m (Delta s = 2C / m): build"
                " it with the clients' sizes"
            )
        records = float(np.mean(ctx.client_sizes))
        noise = UdpPaperNoise(
            udp_multipliers(cfg.rounds, u.epsilon, cfg.privacy.delta, records),
            local=True,
            records=records,
            claims=(paper_claim(u.epsilon, sound=False),),
        )
    else:
        noise = GaussianNoise(
            sound_multipliers(cfg, ctx.num_clients),
            local=True,
            claims=(paper_claim(u.epsilon, sound=True),),
            client_budgets=(float(u.epsilon),) * ctx.num_clients,
        )
    return algorithm, chain(FlatClip(u.clip_norm), noise, UniformWeights())


def check_udp(cfg, need) -> None:
    u = cfg.udp
    need(u.mode in MODES, f"udp.mode {u.mode!r} unknown; use one of {MODES}")
    need(
        u.participations >= 0,
        f"udp.participations must be >= 0 (0 = ceil(lambda T)), got {u.participations}",
    )
    need(u.clip_norm > 0, f"udp.clip_norm C must be > 0, got {u.clip_norm}")
    need(u.epsilon > 0, f"udp.epsilon (the fixed budget) must be > 0, got {u.epsilon}")


SECTION_DOCS = {  # what each key of the section means (``fedjax-dp --help``)
    "clip_norm": "UDP: C, the fixed clip of each upload",
    "epsilon": (
        "UDP: the fixed budget epsilon the per-round noise z_t = 2 c sqrt(t) / epsilon is"
        " calibrated to"
    ),
    "mode": (
        "UDP: paper (Wei et al.'s record-level calibration 2 c sqrt(t) C / (epsilon m): NO formal"
        " guarantee) | sound (client-level, z_t = kappa sqrt(t) calibrated to epsilon, enforced per"
        " client)"
    ),
    "participations": (
        "UDP sound mode: participations each client's budget covers (0 = ceil(lambda T))"
    ),
}
registry.register_section(
    "udp",
    docs=SECTION_DOCS,
    defaults={
        "clip_norm": 1.0,
        "epsilon": 10.0,
        "mode": "paper",
        "participations": 0,
    },
)
registry.register(
    "udp",
    build=build_udp,
    sections=("udp",),
    validate=check_udp,
    privacy_keys=settings.LOCAL,
    summary=(
        "UDP (Wei et al. 2022): FedAvg + fixed clip + local Gaussian noise calibrated per round to"
        " a fixed epsilon"
    ),
)
