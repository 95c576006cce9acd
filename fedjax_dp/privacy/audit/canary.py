"""Empirical privacy auditing: a lower bound on epsilon from a distinguishing test (Jagielski et al.
2020, "Auditing Differentially Private Machine Learning"; Nasr et al. 2021; for client-level DP-FL
the canary-client audit of Maddock et al. 2022, "CANIFE", and Andrew et al. 2024, "One-shot
Empirical Privacy Estimation for Federated Learning").

An (epsilon, delta)-DP mechanism bounds every test between neighbouring inputs:
TPR <= e^epsilon FPR + delta (and the same with the roles of 1 - FPR and 1 - TPR swapped). Running
the mechanism many times with and without a canary client, scoring each output by its projection on
the canary direction, and bounding TPR from below and FPR from above with Clopper-Pearson intervals
    gives epsilon_lower = max over thresholds of log((TPR_low - delta) / FPR_high)
which holds with the stated confidence. The threshold is chosen on one half of the trials and the
bound computed on the other, so selecting it does not bias the bound. A mechanism whose
epsilon_lower exceeds its claimed epsilon is broken (or mis-accounted); a sound one's stays below.

This module runs mechanism-level audits: thousands of one-round trials, vmapped. The mechanism under
audit is any ``mechanism(key, with_canary) -> released vector``; ``dp_fedavg_round`` builds the
round DP-FedAvg releases (the library's own clipping and noise), with deliberately broken variants
for tests; ``cuag_round`` the CUAG-PFL aggregation of locally perturbed uploads (its ``paper``
self-norm clipping and its sound variant).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import beta

from fedjax_dp.privacy.mechanisms import clipping
from fedjax_dp.privacy.mechanisms.gaussian import add_gaussian_noise, standard_normal

BROKEN_VARIANTS = ("sound", "no_noise", "noise_too_small", "no_clipping")


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval for a binomial proportion (each side at (1 - confidence) /
    2)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(
            f"need 0 <= successes <= trials and trials >= 1, got {successes} of {trials}"
        )
    alpha = 1 - confidence
    low = 0.0 if successes == 0 else float(beta.ppf(alpha / 2, successes, trials - successes + 1))
    high = (
        1.0
        if successes == trials
        else float(beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
    )
    return low, high


def epsilon_lower_bound(
    scores_out: np.ndarray,
    scores_in: np.ndarray,
    threshold: float,
    delta: float,
    confidence: float = 0.95,
) -> float:
    """The epsilon lower bound of the test 'score > threshold means the canary was in'."""
    n_out, n_in = len(scores_out), len(scores_in)
    fp, tp = int(np.sum(scores_out > threshold)), int(np.sum(scores_in > threshold))
    tpr_low, _ = clopper_pearson(tp, n_in, confidence)
    _, fpr_high = clopper_pearson(fp, n_out, confidence)
    tnr_low, _ = clopper_pearson(n_out - fp, n_out, confidence)
    _, fnr_high = clopper_pearson(n_in - tp, n_in, confidence)
    bounds = [0.0]
    if tpr_low - delta > 0:
        bounds.append(math.log((tpr_low - delta) / fpr_high))
    if tnr_low - delta > 0:
        bounds.append(math.log((tnr_low - delta) / fnr_high))
    return max(bounds)


@dataclasses.dataclass(frozen=True)
class AuditResult:
    claimed_epsilon: float
    epsilon_lower: float
    delta: float
    trials: int
    threshold: float
    confidence: float

    @property
    def violated(self) -> bool:
        """True when the empirical lower bound exceeds the claim: the claim is false (w.p. >=
        confidence)."""
        return self.epsilon_lower > self.claimed_epsilon


def _split_half_bound(
    out: np.ndarray, inside: np.ndarray, claimed_epsilon: float, delta: float, confidence: float
) -> AuditResult:
    """Threshold chosen on the first half of the trials, the bound computed on the second
    (unbiased)."""
    half = len(out) // 2
    candidates = np.quantile(
        np.concatenate([out[:half], inside[:half]]), np.linspace(0.01, 0.99, 99)
    )
    chosen = max(
        candidates,
        key=lambda t: epsilon_lower_bound(out[:half], inside[:half], t, delta, confidence),
    )
    return AuditResult(
        claimed_epsilon,
        epsilon_lower_bound(out[half:], inside[half:], chosen, delta, confidence),
        delta,
        len(out),
        float(chosen),
        confidence,
    )


def audit(
    mechanism: Callable,
    canary_direction: jax.Array,
    claimed_epsilon: float,
    delta: float,
    trials: int = 20000,
    seed: int = 0,
    confidence: float = 0.95,
) -> AuditResult:
    """Runs ``trials`` releases with and ``trials`` without the canary and bounds epsilon from
    below."""
    if trials < 100:
        raise ValueError(f"an audit needs at least 100 trials per side, got {trials}")
    direction = canary_direction / jnp.linalg.norm(canary_direction)
    score = jax.jit(
        jax.vmap(lambda key, flag: jnp.dot(mechanism(key, flag), direction), in_axes=(0, None))
    )
    keys_out, keys_in = jax.random.split(jax.random.key(seed), 2)
    out = np.asarray(score(jax.random.split(keys_out, trials), False), np.float64)
    inside = np.asarray(score(jax.random.split(keys_in, trials), True), np.float64)
    return _split_half_bound(out, inside, claimed_epsilon, delta, confidence)


def dp_fedavg_round(
    other_updates: jax.Array,
    canary: jax.Array,
    clip_norm: float,
    noise_multiplier: float,
    variant: str = "sound",
) -> Callable:
    """One central DP-FedAvg release: sum of the clipped updates (``other_updates`` (m, d), plus the
    canary when present) + N(0, (z S)^2 I). The adversary knows the other updates and subtracts
    them.

    ``variant`` breaks it on purpose: ``no_noise``; ``noise_too_small`` (z / 10); ``no_clipping``
    (the canary enters unclipped while the noise is still calibrated to S).
    """
    if variant not in BROKEN_VARIANTS:
        raise ValueError(f"variant {variant!r} unknown; choose one of {BROKEN_VARIANTS}")
    clip = (
        (lambda u: u)
        if variant == "no_clipping"
        else (lambda u: clipping.clip_by_global_norm(u, clip_norm).clipped)
    )
    z = {"no_noise": 0.0, "noise_too_small": noise_multiplier / 10}.get(variant, noise_multiplier)
    others = jnp.sum(jax.vmap(clip)(other_updates), axis=0)

    def mechanism(key, with_canary):
        total = others + jnp.where(with_canary, 1.0, 0.0) * clip(canary)
        return add_gaussian_noise(total, z * clip_norm, key) - others

    return mechanism


def adaptive_clip_count_round(
    clip, other_norms, canary_norm: float, centred: bool = True
) -> Callable:
    """The noised count of Andrew et al. 2021's adaptive clip as
    ``upload_clipping.AdaptiveQuantileClip`` releases it: each present client's unclipped bit
    (through the transform's own client side), summed, plus N(0, sigma_b^2)
    (``clip.count_noise_std``). Add/remove neighbours: the canary client (norm ``canary_norm``) is
    present or absent. ``centred=False`` re-creates an earlier accounting bug (CHANGELOG.md): 0/1
    bits (sensitivity 1) where the claim assumes centred bits b - 1/2 (sensitivity 1/2). The
    adversary knows the other clients' bits and subtracts them."""
    from fedjax_dp.core.uploads import ClientContext

    state = clip.init(None)

    def bit(norm, present):
        ctx = ClientContext(state, {}, jnp.float32(jnp.inf), jax.random.key(0), present, present)
        count = clip.client({"u": jnp.array([norm], jnp.float32)}, ctx).extras["count"]
        return count if centred else jnp.where(present, count + clip.COUNT_BOUND, 0.0)

    others = jnp.sum(
        jax.vmap(lambda n: bit(n, jnp.bool_(True)))(jnp.asarray(other_norms, jnp.float32))
    )

    def mechanism(key, with_canary):
        count = others + bit(jnp.float32(canary_norm), jnp.asarray(with_canary))
        return jnp.reshape(count + clip.count_noise_std * standard_normal(key, ()) - others, (1,))

    return mechanism


def client_perturbation(transforms, template, round_index: int = 1) -> Callable:
    """``perturb(layers, key)``: the client sides of the upload ``transforms`` that run (no
    validation: a part of a chain, say its clip and noise) on one client's upload of ``template``'s
    structure, their noise from ``key``; what ``cuag_round`` audits, so the audit runs the mechanism
    the runs use."""
    from fedjax_dp.core.uploads import UNBOUNDED, Chain, ClientContext

    uploads = Chain(transforms)
    states, inputs = uploads.init(template), uploads.inputs(round_index)

    def perturb(layers, key):
        noise_key, count_key = jax.random.split(key)
        upload, bound = layers, jnp.float32(UNBOUNDED)
        for t, state, values in zip(uploads, states, inputs):
            flow = t.client(
                upload,
                ClientContext(
                    state,
                    values,
                    bound,
                    noise_key,
                    jnp.bool_(True),
                    jnp.bool_(True),
                    count_key=count_key,
                ),
            )
            upload, bound = flow.upload, flow.bound
        return upload

    return perturb


def cuag_round(
    other_updates: jax.Array,
    canary: jax.Array,
    perturb: Callable,
    replacement: jax.Array | None = None,
) -> Callable:
    """One CUAG-PFL aggregation (seed 004, Alg. 4; ``adaptive_gdp``): every client perturbs its own
    upload with ``perturb(layers, key)`` (local noise) and the server sums them. Each (d,) update is
    split in two layers so the per-layer rules are exercised. The adversary knows the other clients'
    raw updates and subtracts them.

    Neighbouring relation: local noise protects what a client sends, not whether it sends, so the
    canary client takes part in both worlds, uploading ``canary`` or ``replacement`` (default zero;
    the pair's distance, not more, is what a claim for sensitivity ||canary - replacement|| covers).
    With CUAG-PFL's paper noise (``client_perturbation`` of ``CuagPaperNoise``: noise scaled by each
    layer's own norm) the audit exposes the missing guarantee; with its sound mode's clip and noise
    it must stay below the accounted claim.
    """
    half = other_updates.shape[1] // 2
    replacement = jnp.zeros_like(canary) if replacement is None else replacement

    def upload(u, key):
        noisy = perturb({"a": u[:half], "b": u[half:]}, key)
        return jnp.concatenate([noisy["a"], noisy["b"]])

    def mechanism(key, with_canary):
        keys = jax.random.split(key, other_updates.shape[0] + 1)
        noisy_others = jax.vmap(upload)(other_updates, keys[1:])
        own = upload(jnp.where(with_canary, canary, replacement), keys[0])
        return jnp.sum(noisy_others, axis=0) + own - jnp.sum(other_updates, axis=0)

    return mechanism


def audit_training_run(
    round_for,
    params,
    cohort: dict,
    canary_cohort: dict,
    rounds: int,
    noise_multiplier: float,
    claimed_epsilon: float,
    delta: float,
    trials: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> AuditResult:
    """End-to-end audit of a short DP-FedAvg run through the real round code.

    ``round_for(z)`` builds the ``core.round.FederatedRound`` (algorithm and upload chain) with
    noise multiplier z. Each trial runs ``rounds`` rounds of it (clipping, noise, server optimizer)
    from ``params`` on the fixed cohort ``cohort`` (full participation), with or without the extra
    gradient-crafted canary client of ``canary_cohort`` (one packed client, concatenated to the
    cohort; its data is chosen so that its update is large and points one way). The score is the
    projection of w_R - w_0 on the canary's clipped first-round update direction. Neighbouring
    relation: add/remove the canary client; the claim to test is ``rounds`` Gaussian rounds of
    multiplier z without sampling. The chain's denominator must be fixed (not depend on the canary).
    """
    import jax.flatten_util

    with_canary = jax.tree_util.tree_map(lambda a, b: np.concatenate([a, b]), cohort, canary_cohort)
    flat0, _ = jax.flatten_util.ravel_pytree(params)
    # the canary's own update from w_0 (no noise, alone): its direction is what the adversary looks
    # for
    noiseless, algorithm = round_for(0.0), round_for(noise_multiplier)
    alone = noiseless.round(noiseless.init(params), canary_cohort, jax.random.key(seed))[0]
    direction = jax.flatten_util.ravel_pytree(alone.params)[0] - flat0
    if not float(jnp.linalg.norm(direction)) > 0:
        raise ValueError(
            "the canary client's update is zero: craft its data so that it moves the model"
        )
    direction = direction / jnp.linalg.norm(direction)

    def score(key, packed):
        state = algorithm.init(params)
        for r in range(rounds):
            state, _ = algorithm.round(state, packed, jax.random.fold_in(key, r))
        return float(jnp.dot(jax.flatten_util.ravel_pytree(state.params)[0] - flat0, direction))

    keys = jax.random.split(jax.random.key(seed + 1), 2 * trials)
    out = np.array([score(keys[i], cohort) for i in range(trials)])
    inside = np.array([score(keys[trials + i], with_canary) for i in range(trials)])
    return _split_half_bound(out, inside, claimed_epsilon, delta, confidence)
