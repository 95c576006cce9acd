"""CUAG-PFL (seed 004, Alg. 1-4; ALGORITHMS.md §4): PFLDyn(Proto) whose uploads are compressed by
compressed sensing and then noised by the adaptive Gaussian DP of Alg. 4.

The upload chain is ``chain(compress_cs, noise, uniform weights)``: each client measures every layer
of Delta w_n (the ``compression`` section: Alg. 2 dynamic rates r_min 0.2 / r_max 0.5 from w^0, then
from the last reconstructed aggregate; Alg. 3 ``block`` operator or ``gaussian`` / ``bernoulli``; or
a fixed rate), noises the measurements, and the server reconstructs the mean of the noised
measurements (Alg. 1 lines 26-27) before PFLDyn's server step. ``cuag.mode``:

* ``paper``: Alg. 4 as written (``privacy.mechanisms.upload_cuag_noise.CuagPaperNoise``): C_l = the
  layer's own norm, sigma_t schedule from mu. NO formal guarantee (warned; ``formal: false``
  wherever its epsilon appears); the ledger records the paper's own CLT figure for the rounds each
  client ran, and ``privacy.json`` lists the paper's claim (mu -> epsilon, 0.92 for mu = 0.25 at
  1e-5) beside it. Alg. 4's sigma_t grows with t and PFLDyn's g keeps every round's noise: in the
  Table 2 setting the run peaks within 10-30 rounds and diverges by ~75 (experiments/RESULTS.md,
  "Past 20 rounds").
* ``sound``: the same structure with a fixed threshold C (``cuag.clip_norm``) on every measured
  layer (sensitivity C sqrt(L)) and local Gaussian noise z_n C sqrt(L). z_n is calibrated so that K
  participations (``cuag.participations``; 0 = ceil(lambda T), the expected count) compose to
  exactly the client's mu_n under replace-one neighbours (each participation is (2/z_n)-GDP, exact
  composition: sqrt(K) 2 / z_n = mu_n); each client's ledger holds its budget mu_n and a client
  whose next participation would exceed it is no longer sampled. The epsilon reported is the
  ledger's exact GDP composition of what ran (a guarantee). ``cuag.sound_noise='sigma_t'`` gives the
  noise Alg. 4's shape
  instead: z_t = kappa sigma_t (least noise early, most late), kappa calibrated so that K
  participations in ANY rounds spend at most mu: kappa = (2 / mu) sqrt(sum of the K largest
  sigma_t^-2), i.e. the K least-noisy rounds
  (``privacy.accounting.calibration.worst_case_multipliers``). (An earlier calibration to mu
  in expectation over random rounds, kappa = (2 / mu) sqrt(K mean_t sigma_t^-2), priced one round-1
  participation at 1.56 mu^2 in the Table 2 setting: no client could take part and the run stopped
  before round 1.) ``cuag.noise_multiplier`` > 0 fixes z instead (a multiplier of the sensitivity C
  sqrt(L)): no budget, the epsilon spent is reported. ``cuag.adaptive_clip`` replaces the fixed C by
  per-layer thresholds that follow the ``cuag.target_quantile`` of each layer's norms (Andrew et al.
  2021 per layer, ``privacy.mechanisms.upload_layer_quantile_clip``), each client noising its own
  per-layer counts; the counts cost L / sigma_b^2 of mu^2 a participation, and the upload noise is
  calibrated to what they leave. (The PriFedSync baseline is ``algorithms.prifedsync``.)
* ``cuag.sigma`` (Table 5: sigma and C each fixed or adaptive) runs Alg. 4's own noise,
  N(0, (2 C_l sigma / B)^2) per entry, with sigma fixed (a number) or the sigma_t schedule
  (``schedule``; |D| the mean client size): in ``paper`` mode with C_l the layer's own norm (no
  guarantee; ``schedule`` is the default there), in ``sound`` mode with C_l = ``cuag.clip_norm``
  after clipping, i.e. multiplier z_t = 2 sigma_t / (B sqrt(L)) of the sensitivity C sqrt(L): a
  formal guarantee whose (very large) epsilon is accounted, no budget.
* ``none``: no noise (CUAG's compression on PFLDyn(Proto); with rate 1 it is PFLDyn(Proto)).

Heterogeneous DP (Table 8): ``cuag.client_mu`` gives each client its own mu_n ("0.1:4": N values
evenly spaced in [0.1, 4], assigned at random with the run's seed; "a,b,c": those values, equally
often); the noise of each client follows its mu_n and ``privacy.json`` gives the distribution of
per-client epsilons.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.pfldyn_proto import build_pfldyn_algorithm, check_pfldyn
from fedjax_dp.core.uploads import UniformWeights, chain
from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy.mechanisms import adaptive_gdp
from fedjax_dp.privacy import sampling, settings
from fedjax_dp.privacy.accounting.calibration import (
    constant_multipliers,
    expected_participations,
    worst_case_multipliers,
)
from fedjax_dp.privacy.mechanisms.upload_cuag_noise import (
    CuagPaperNoise,
    alg4_multipliers,
    cuag_sound_noise,
    piecewise_schedule,
)
from fedjax_dp.privacy.mechanisms.upload_layer_quantile_clip import PerLayerQuantileClip

MODES = ("paper", "sound", "none")
SOUND_NOISE = ("constant", "sigma_t")


def parse_client_mu(text: str, mu: float, num_clients: int, seed: int) -> np.ndarray:
    """mu_n per client: ``""`` (all ``mu``), ``"a:b"`` (evenly spaced in [a, b], shuffled) or
    ``"a,b,..."``."""
    text = str(text).strip()
    if not text:
        values = np.full(num_clients, float(mu))
    elif ":" in text:
        low, high = (float(v) for v in text.split(":"))
        values = np.random.default_rng([seed, 4]).permutation(np.linspace(low, high, num_clients))
    else:
        listed = [float(v) for v in text.split(",") if v.strip()]
        values = np.random.default_rng([seed, 4]).permutation(
            np.resize(np.asarray(listed), num_clients)
        )
    if not np.all(values > 0):
        raise ValueError(
            f"cuag.client_mu={text!r} / cuag.mu={mu}: every mu_n must be > 0, got min"
            f" {values.min()}"
        )
    return values


def parse_sigma(text) -> float | str | None:
    """``cuag.sigma``: ``""`` (the mode's default), ``"schedule"`` (Alg. 4's sigma_t) or a fixed
    sigma > 0."""
    text = str(text).strip()
    if text in ("", "schedule"):
        return text or None
    try:
        sigma = float(text)
    except ValueError:
        sigma = float("nan")
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(
            f"cuag.sigma={text!r} must be '', 'schedule' or a positive number (Alg. 4's sigma held"
            " fixed)"
        )
    return sigma


def alg4_sigmas(sigma, cfg, ctx) -> list[float]:
    """sigma_t for t = 1..T: the fixed ``sigma`` or Alg. 4's schedule at the mean client size."""
    if sigma != "schedule":
        return [float(sigma) * cfg.cuag.sigma_scale]
    size = int(np.mean(ctx.client_sizes)) if ctx.client_sizes else 500
    setting = dict(
        sampling_rate=ctx.sampling_rate(),
        batch_size=cfg.client.batch_size,
        dataset_size=size,
        local_steps=cfg.pfldyn.local_steps,
    )
    return [
        adaptive_gdp.noise_scale(t, cfg.cuag.mu, **setting) * cfg.cuag.sigma_scale
        for t in range(1, cfg.rounds + 1)
    ]


def planned_participations(cfg, num_clients: int) -> int:
    """K of the sound mode's calibration: ``cuag.participations`` or ceil(lambda T)."""
    rate = sampling.build(cfg.sampling, num_clients).rate_at(1)
    return expected_participations(rate, cfg.rounds, cfg.cuag.participations)


def build_cuag(ctx) -> tuple:
    cfg, c = ctx.cfg, ctx.cfg.cuag
    algorithm = build_pfldyn_algorithm(ctx)
    if c.mode == "none":
        return algorithm, chain()
    mus = parse_client_mu(c.client_mu, c.mu, ctx.num_clients, cfg.seed)
    heterogeneous = bool(str(c.client_mu).strip())
    sigma = parse_sigma(c.sigma)
    if c.mode == "paper":
        fixed = isinstance(sigma, float)
        noise = CuagPaperNoise(
            mu=c.mu,
            sampling_rate=ctx.sampling_rate(),
            batch_size=cfg.client.batch_size,
            dataset_size=int(np.mean(ctx.client_sizes)) if ctx.client_sizes else 500,
            local_steps=cfg.pfldyn.local_steps,
            client_mus=tuple(float(m) for m in mus) if heterogeneous else None,
            client_sizes=ctx.client_sizes,
            fixed_sigma=sigma if fixed else 0.0,
            sigma_scale=float(c.sigma_scale),
            claimed_mu=0.0 if fixed or heterogeneous or c.sigma_scale != 1.0 else float(c.mu),
            claim_note=paper_note(sigma if fixed else None, mus),
            details=(("per_client_mu", None if fixed else [float(m) for m in mus]),),
        )
        return algorithm, chain(noise, UniformWeights())
    layers = len(jax.tree_util.tree_leaves(ctx.params_template))
    clip = adaptive_layer_clip(cfg, ctx, layers) if c.adaptive_clip else None
    # the local counts' mu^2 a participation
    reserved = clip.count_mu_squared() if clip is not None else 0.0
    participations = planned_participations(cfg, ctx.num_clients)
    if (
        clip is not None
        and calibrated_to_budget(c)
        and participations * reserved >= float(mus.min()) ** 2
    ):
        least = math.sqrt(participations * layers) / float(mus.min())
        raise ValueError(
            f"cuag.count_noise_std={c.count_noise_std}: the per-layer clip counts of"
            f" {participations} participations ({layers} layers each) alone spend mu ="
            f" {float(mus.min()):g}; it must exceed sqrt(K L) / mu = {least:.4g} to leave budget"
            " for the uploads"
        )
    client_z = None
    if sigma is not None:  # Alg. 4's noise 2 C sigma_t / B at the fixed C: accounted, no budget
        schedule = alg4_multipliers(alg4_sigmas(sigma, cfg, ctx), cfg.client.batch_size, layers)
    elif c.noise_multiplier:  # a fixed z: accounted, not calibrated
        schedule = ((1, float(c.noise_multiplier)),)
    elif c.sound_noise == "sigma_t":
        schedule = piecewise_schedule(
            worst_case_multipliers(
                alg4_sigmas("schedule", cfg, ctx), c.mu, participations, reserved
            )
        )
    else:
        z = constant_multipliers(mus, participations, reserved)
        schedule, client_z = (
            ((1, float(z.min())),),
            (tuple(float(v) for v in z) if heterogeneous else None),
        )
    clip_transform, noise = cuag_sound_noise(
        (float(c.clip_norm),) * layers, schedule, client_z, clip=clip
    )
    calibrated = calibrated_to_budget(c)
    # mu_n set the noise (a budget, or the sigma_t schedule's target)
    set_noise = calibrated or sigma == "schedule"
    budgets = (
        tuple(gdp.epsilon_from_mu(float(m), cfg.privacy.delta) for m in mus) if calibrated else None
    )
    noise = dataclasses.replace(
        noise,
        client_budgets=budgets,
        note=sound_note(c, calibrated, participations, mus),
        details=(("per_client_mu", [float(m) for m in mus] if set_noise else None),),
    )
    return algorithm, chain(clip_transform, noise, UniformWeights())


def paper_note(fixed_sigma, mus) -> str:
    """What privacy.json says of paper mode's figures (the claim, the formula, the per-client
    figures)."""
    if fixed_sigma is not None:
        return (
            f"paper mode with Alg. 4's sigma held fixed at {fixed_sigma:g} (cuag.sigma): the"
            " paper's mu is what its sigma_t schedule is calibrated to, which did not run, so no"
            " claim of the paper's applies (epsilons has no paper_claim); epsilon"
            " (epsilons.paper_formula) is the paper's CLT formula for the fixed sigma over the"
            " rounds run, lambda included; the per-client figures are that formula without lambda"
            " (a client that took part) over the rounds each client ran. Not a guarantee: formal"
            " is false."
        )
    claimed = sorted({float(m) for m in mus})
    return (
        "paper mode: the paper claims mu = "
        + (f"{claimed[0]:g}" if len(claimed) == 1 else f"mu_n in [{claimed[0]:g}, {claimed[-1]:g}]")
        + " for the whole run (epsilons.paper_claim); epsilon (epsilons.paper_formula) is the"
        " paper's formula as the paper states it over the rounds run (mu_t^2 summed over the"
        " rounds, lambda included: mu sqrt(H_T) for the sigma_t schedule); the per-client figures"
        " are that formula without lambda (a client that took part) over the rounds each client"
        " ran. None is a guarantee: formal is false."
    )


def sound_note(c, calibrated: bool, participations: int, mus) -> str:
    """What privacy.json says of the sound mode's calibration."""
    if not calibrated:
        note = (
            "sound mode with fixed noise (cuag.noise_multiplier or cuag.sigma): no budget; the"
            " epsilons listed are the exact composition of the participations each client ran"
        )
        if parse_sigma(c.sigma) != "schedule":
            note += (
                "; cuag.mu / cuag.client_mu set no part of this run's noise (sigma or z held"
                " fixed), so accounting.per_client_mu is null"
            )
        return note
    return (
        f"sound mode: each client's noise is calibrated so that {participations} participations"
        f" spend its own budget mu_n (min {mus.min():g}, max {mus.max():g})"
        + (
            ", with z_t proportional to Alg. 4's sigma_t (any K participations fit the budget)"
            if c.sound_noise == "sigma_t"
            else ""
        )
        + "; a client whose next participation would exceed it is no longer sampled."
    )


def adaptive_layer_clip(cfg, ctx, layers: int) -> PerLayerQuantileClip:
    """The sound mode's per-layer adaptive clip: every layer from C = ``cuag.clip_norm`` towards the
    ``cuag.target_quantile`` of its norms, counts noised by each client (local), D the expected
    cohort."""
    c = cfg.cuag
    return PerLayerQuantileClip(
        initial_layer_norms=(float(c.clip_norm),) * layers,
        target_quantile=float(c.target_quantile),
        learning_rate=float(c.clip_learning_rate),
        count_noise_std=float(c.count_noise_std),
        denominator=ctx.sampling_rate() * ctx.num_clients,
        local=True,
    )


def calibrated_to_budget(c) -> bool:
    """Whether the sound mode's noise is calibrated to each client's mu_n (else fixed: no
    budget)."""
    return c.mode == "sound" and not c.noise_multiplier and parse_sigma(c.sigma) is None


def check_cuag(cfg, need) -> None:
    check_pfldyn(cfg, need)
    c = cfg.cuag
    need(c.mode in MODES, f"cuag.mode {c.mode!r} unknown; use one of {MODES}")
    need(c.mu > 0, f"cuag.mu must be > 0, got {c.mu}")
    need(
        c.clip_norm > 0,
        f"cuag.clip_norm (the sound mode's per-layer C) must be > 0, got {c.clip_norm}",
    )
    need(
        c.participations >= 0,
        f"cuag.participations must be >= 0 (0 = ceil(lambda T)), got {c.participations}",
    )
    need(
        c.noise_multiplier >= 0,
        f"cuag.noise_multiplier must be >= 0 (0 = calibrated from mu), got {c.noise_multiplier}",
    )
    need(
        not (c.noise_multiplier and str(c.client_mu).strip()),
        f"cuag.noise_multiplier={c.noise_multiplier} fixes one z for every client; it cannot follow"
        f" cuag.client_mu={c.client_mu!r} (leave one of them unset)",
    )
    need(
        not c.noise_multiplier or c.mode == "sound",
        f"cuag.noise_multiplier={c.noise_multiplier} applies to cuag.mode='sound' only, got mode"
        f" {c.mode!r}",
    )
    need(
        c.sound_noise in SOUND_NOISE,
        f"cuag.sound_noise {c.sound_noise!r} unknown; use one of {SOUND_NOISE}",
    )
    need(
        c.sigma_scale > 0 and math.isfinite(c.sigma_scale),
        f"cuag.sigma_scale must be a finite number > 0, got {c.sigma_scale}",
    )
    need(
        c.sigma_scale == 1.0 or c.mode == "paper" or str(c.sigma).strip(),
        f"cuag.sigma_scale={c.sigma_scale} scales Alg. 4's sigma: it applies to cuag.mode='paper'"
        f" or with cuag.sigma set, not to the {c.mode!r} mode's calibrated noise",
    )
    if c.adaptive_clip:
        need(
            c.mode == "sound",
            f"cuag.adaptive_clip=True adapts the sound mode's C_l; got cuag.mode={c.mode!r}",
        )
        need(
            c.count_noise_std > 0,
            "cuag.adaptive_clip=True needs cuag.count_noise_std > 0 (each client's local noise "
            f"on its per-layer counts), got {c.count_noise_std}",
        )
        need(
            0 < c.target_quantile < 1,
            f"cuag.target_quantile must lie in (0, 1), got {c.target_quantile}",
        )
        need(
            c.clip_learning_rate > 0,
            f"cuag.clip_learning_rate must be > 0, got {c.clip_learning_rate}",
        )
    if c.sound_noise == "sigma_t":
        need(
            c.mode == "sound",
            f"cuag.sound_noise='sigma_t' shapes the sound mode's noise; got cuag.mode={c.mode!r}",
        )
        need(
            not c.noise_multiplier and not str(c.sigma).strip(),
            "cuag.sound_noise='sigma_t' calibrates the noise to mu;"
            f" cuag.noise_multiplier={c.noise_multiplier} / cuag.sigma={c.sigma!r} would fix it"
            " (leave them unset)",
        )
        need(
            not str(c.client_mu).strip(),
            "cuag.sound_noise='sigma_t' takes one mu for all clients; "
            f"cuag.client_mu={c.client_mu!r} is not supported with it",
        )
    try:
        sigma = parse_sigma(c.sigma)
    except ValueError as error:
        need(False, str(error))
        return
    if sigma is not None:
        need(
            c.mode != "none",
            f"cuag.sigma={c.sigma!r} sets Alg. 4's noise; cuag.mode='none' adds none",
        )
        need(
            not c.noise_multiplier,
            f"cuag.sigma={c.sigma!r} and cuag.noise_multiplier={c.noise_multiplier} both "
            "fix the noise (leave one of them unset)",
        )
        need(
            not (isinstance(sigma, float) and str(c.client_mu).strip()),
            f"cuag.sigma={c.sigma!r} fixes sigma for every client; it cannot follow"
            f" cuag.client_mu={c.client_mu!r}",
        )
        need(
            not (c.mode == "sound" and str(c.client_mu).strip()),
            f"cuag.sigma={c.sigma!r} in sound mode is not calibrated to a budget;"
            f" cuag.client_mu={c.client_mu!r} would be ignored (leave one of them unset)",
        )
    need(
        cfg.compression.enabled,
        "cuag_pfl compresses every upload: set compression.enabled=True (compression.rates="
        "'dynamic' for Alg. 2, or a fixed rate; '1.0' with cuag.mode='none' is PFLDyn(Proto))",
    )
    if str(c.client_mu).strip():  # without a list every mu_n is cuag.mu, checked above
        try:
            parse_client_mu(c.client_mu, c.mu, max(cfg.data.num_clients, 1), cfg.seed)
        except ValueError as error:
            need(False, str(error))


SECTION_DOCS = {  # what each key of the section means (``fedjax-dp --help``)
    "mode": (
        "CUAG-PFL noise: paper (Alg. 4 as written: NO formal guarantee, labelled) | sound | none"
    ),
    "mu": "CUAG-PFL: the GDP target mu (paper: 0.25, epsilon 0.92 at delta 1e-5 claimed)",
    "client_mu": (
        "CUAG-PFL: per-client mu, '0.1:4' (evenly spaced, shuffled) or 'a,b,c' ('' = cuag.mu for"
        " all)"
    ),
    "clip_norm": "CUAG-PFL sound mode: C per measured layer",
    "participations": (
        "CUAG-PFL sound mode: participations each client's mu covers (0 = ceil(lambda T))"
    ),
    "noise_multiplier": (
        "CUAG-PFL sound mode: > 0 fixes z instead of calibrating it (epsilon accounted)"
    ),
    "sound_noise": (
        "CUAG-PFL sound mode calibrated to mu: constant z | sigma_t (z_t proportional to Alg. 4's "
        "sigma_t)"
    ),
    "sigma": (
        "CUAG-PFL: Alg. 4's noise 2 C_l sigma / B with sigma fixed (a number) or 'schedule'"
        " (sigma_t); C_l the own norm (paper, no guarantee) or cuag.clip_norm (sound, accounted)"
    ),
    "sigma_scale": (
        "CUAG-PFL: Alg. 4's sigma (fixed or sigma_t) times this factor, the noise-scale sweep"
        "; in paper mode a scale other than 1 voids the paper's claim (no paper_claim is"
        " reported)"
    ),
    "adaptive_clip": (
        "CUAG-PFL sound mode: per-layer adaptive quantile clipping (Andrew et al. 2021) from "
        "cuag.clip_norm, counts noised locally and accounted"
    ),
    "target_quantile": (
        "CUAG-PFL adaptive_clip: the quantile gamma of each layer's norms to clip at"
    ),
    "clip_learning_rate": "CUAG-PFL adaptive_clip: eta of C_l <- C_l exp(-eta (b_bar - gamma))",
    "count_noise_std": (
        "CUAG-PFL adaptive_clip: sigma_b of each client's local noise on its per-layer counts"
        " (costs L / sigma_b^2 of mu^2 a participation)"
    ),
}
registry.register_section(
    "cuag",
    docs=SECTION_DOCS,
    read_when=(
        # paper mode clips each layer at its own norm (Alg. 4)
        ("cuag.clip_norm", "cuag.mode", ("sound",)),
        ("cuag.participations", "cuag.mode", ("sound",)),
        ("cuag.target_quantile", "cuag.adaptive_clip", (True,)),
        ("cuag.clip_learning_rate", "cuag.adaptive_clip", (True,)),
        ("cuag.count_noise_std", "cuag.adaptive_clip", (True,)),
    ),
    defaults={
        "mode": "paper",
        "mu": 0.25,
        "client_mu": "",
        "clip_norm": 1.0,
        "participations": 0,
        "noise_multiplier": 0.0,
        "sound_noise": "constant",
        "sigma": "",
        "sigma_scale": 1.0,
        "adaptive_clip": False,
        "target_quantile": 0.5,
        "clip_learning_rate": 0.2,
        "count_noise_std": 0.0,
    },
)
registry.register(
    "cuag_pfl",
    build=build_cuag,
    sections=("pfldyn", "cuag"),
    validate=check_cuag,
    privacy_keys=settings.LOCAL,
    unread=registry.SAMPLED_STEPS + registry.OWN_SERVER_STEP,
    summary=(
        "CUAG-PFL (seed 004): PFLDyn(Proto) + compressed-sensing uploads + adaptive Gaussian DP"
    ),
)
