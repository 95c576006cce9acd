"""PriFedSync (Zheng, Chen, Long, Su 2021, "Federated f-Differential Privacy", AISTATS) as seed 004
runs it as a CUAG-PFL baseline (§7.2.3 item 4, §7.2.4; ALGORITHMS.md §4): Gaussian DP with a FIXED
noise scale and a FIXED clip on PFLDyn(Proto), the contrast to CUAG-PFL's adaptive ones. Seed 004's
settings: sigma = 0.45, clip 1, no compression; it reports epsilon in [0.41, 10.24] over 300 rounds.

The mechanism (a reading, stated: the seed describes PriFedSync as its own GDP framework with sigma
and C fixed, the cell sigma = 0.45, C = 1 of its Table 5): client n runs PFLDyn(Proto)'s local steps
(``pfldyn_proto``), clips each layer of Delta w_n to C and adds Alg. 4's noise N(0, (2 C sigma /
B)^2) to every entry (``chain(PerLayerClip, local Gaussian, uniform mean)``: multiplier z = 2 sigma
/ (B sqrt(L)) of the sensitivity C sqrt(L)); the server averages and takes PFLDyn's step.

Two epsilons are recorded:

* the guarantee (``epsilon``, ``formal: true``): client-level local DP, replace-one, each
  participation a Gaussian of that z composed exactly per client (no amplification by sampling: the
  noise is added by the client and the server sees every upload), as CUAG-PFL's sound mode accounts.
  z is tiny (0.0064 for the 8 layers of ``cnn_pfl``), so this epsilon is enormous;
* the seed's figure (``epsilons.paper_claim``, no guarantee): the f-DP central limit theorem of
  Zheng et al. / Bu et al. for DP-SGD, mu_t = q sqrt(t (e^{1 / sigma^2} - 1)) with q = lambda B /
  |D| (one step a round), which reproduces the seed's range exactly (lambda 0.1, B 50, |D| 500:
  0.4068 at t = 1, 10.236 at t = 300, delta 1e-5). It assumes per-example clipping of one subsampled
  step a round; the upload of P local steps clipped once per layer is bounded only at the client
  level.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.pfldyn_proto import build_pfldyn_algorithm, check_pfldyn
from fedjax_dp.core.uploads import Claim, UniformWeights, chain
from fedjax_dp.privacy import settings
from fedjax_dp.privacy.mechanisms.upload_cuag_noise import alg4_multipliers, cuag_sound_noise


def claimed_mu(
    sigma: float, rounds: int, sampling_rate: float, batch_size: int, dataset_size: float
) -> float:
    """The seed's figure after ``rounds`` rounds: q sqrt(t (e^{1/sigma^2} - 1)), q = lambda B /
    |D|."""
    q = sampling_rate * batch_size / dataset_size
    exponent = sigma**-2.0
    # e^700: past float64
    return q * math.sqrt(rounds * math.expm1(exponent)) if exponent < 700 else math.inf


def build_prifedsync(ctx) -> tuple:
    p, batch = ctx.cfg.prifedsync, ctx.cfg.client.batch_size
    layers = len(jax.tree_util.tree_leaves(ctx.params_template))
    clip, noise = cuag_sound_noise(
        (float(p.clip_norm),) * layers, alg4_multipliers([p.sigma], batch, layers)
    )
    size = float(np.mean(ctx.client_sizes)) if ctx.client_sizes else 500.0
    noise = dataclasses.replace(
        noise, claims=(seed_claim(float(p.sigma), ctx.sampling_rate(), batch, size),)
    )
    return build_pfldyn_algorithm(ctx), chain(clip, noise, UniformWeights())


def seed_claim(sigma: float, rate: float, batch_size: int, dataset_size: float) -> Claim:
    """The seed's f-DP CLT figure, mu^2 = q^2 (e^(1/sigma^2) - 1) a round (``claimed_mu`` over t
    rounds)."""
    mu = claimed_mu(sigma, 1, rate, batch_size, dataset_size)
    return Claim(
        "paper_claim",
        mu_squared=mu * mu if math.isfinite(mu) else math.inf,
        note=(
            "PriFedSync: the seed's f-DP CLT figure mu = q sqrt(t (e^(1/sigma^2) - 1)), q = lambda"
            f" B / |D| = {rate * batch_size / dataset_size:.4g}, sigma = {sigma:g}, over the t"
            " rounds run: NOT a guarantee (it assumes one per-example-clipped step a round); the"
            " epsilon of the run is the exact client-level composition of the noise that ran"
        ),
    )


def check_prifedsync(cfg, need) -> None:
    check_pfldyn(cfg, need)
    p = cfg.prifedsync
    need(p.clip_norm > 0, f"prifedsync.clip_norm C must be > 0, got {p.clip_norm}")
    need(
        p.sigma > 0, f"prifedsync.sigma must be > 0 (noise 2 C sigma / B per entry), got {p.sigma}"
    )


SECTION_DOCS = {  # what each key of the section means (``fedjax-dp --help``)
    "clip_norm": "PriFedSync: C, the fixed per-layer clip of each PFLDyn(Proto) upload",
    "sigma": (
        "PriFedSync: fixed sigma of the local noise N(0, (2 C sigma / B)^2) per entry (seed 004:"
        " 0.45)"
    ),
}
registry.register_section(
    "prifedsync",
    docs=SECTION_DOCS,
    defaults={
        "clip_norm": 1.0,
        "sigma": 0.45,
    },
)
registry.register(
    "prifedsync",
    build=build_prifedsync,
    sections=("pfldyn", "prifedsync"),
    validate=check_prifedsync,
    privacy_keys=settings.LOCAL,
    unread=registry.SAMPLED_STEPS + registry.OWN_SERVER_STEP,
    summary=(
        "PriFedSync (Zheng et al. 2021) as seed 004 runs it: PFLDyn(Proto) + fixed per-layer clip +"
        " fixed local Gaussian noise 2 C sigma / B"
    ),
)
