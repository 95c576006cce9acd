"""``hypergrad.source=clients``: the hyper-gradient from the sampled clients' own held-out data,
each client's contribution clipped and noised, accounted as the round's further releases.

Federated automatic differentiation (Rush, Charles and Garrett, "Federated automatic
differentiation", TMLR 2024, Sec. 3: a federated computation's derivative by the chain rule,
one communication per factor). Round t ran with the settings theta (log-multipliers,
``differentiable``) and gave w_{t+1} = ServerUpdate(w_t, mean(theta); theta_s) with mean the
released, noised mean of the clipped uploads Delta_j(theta_c). The objective is the cohort's
held-out loss after the round, L(w) = sum_i L_i(w) / D (L_i: client i's mean loss on a batch of
its own local test data; D: the round's denominator, the fixed expected cohort under DP). By the
chain rule, with the round's noise held fixed,

    dL/dtheta_s = g . dw_{t+1}/dtheta_s,
    dL/dtheta_c = (1 / D) sum_j u . dDelta_j/dtheta_c,    u = (dw_{t+1}/dmean)^T g,
    g = sum_i grad L_i(w_{t+1}) / D,

so two releases on round t's cohort give it:

1. **held-out gradients**: each sampled client i sends grad L_i(w_{t+1}) clipped to C
   (``hypergrad.clip``); the server adds N(0, (z C)^2 I) (z = ``hypergrad.noise_multiplier``) to
   the sum and divides by D: the released g. The server-rate entry g . dw_{t+1}/dtheta_s is then
   post-processing of g and of the round's released mean.
2. **setting derivatives** (only where ``client_lr`` or ``step_weights`` adapt): the server
   broadcasts u (post-processing of g); each client j sends the vector u . dDelta_j/dtheta_c over
   the adapted client settings (a vector-Jacobian product through its local training and clip),
   clipped to C' (``hypergrad.setting_clip``); the server adds N(0, (z C')^2 I) and divides by D.

Each is a Gaussian release with add/remove-one sensitivity equal to its clip (a client adds or
removes one clipped vector), on the cohort the round's sampler drew: the central ledger composes
them with the round's own release as releases on one cohort (``core.uploads.DeclaredReleases``
declares them in the upload chain, so the budget checks, the calibration of the round's z and
``privacy.json`` see them). The second release's vectors depend on g, itself released: adaptive
composition. The held-out loss itself is never released (no ``hypergrad_loss`` in the rows).

In simulation both releases read the round's cohort again after the round; a client with no local
test data sends zeros (it still counts in D).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.core import rng, tree
from fedjax_dp.core.algorithm import Aggregate
from fedjax_dp.core.local_training import masked_mean
from fedjax_dp.core.release import Release
from fedjax_dp.privacy.mechanisms.clipping import clip_by_global_norm
from fedjax_dp.privacy.mechanisms.gaussian import add_gaussian_noise

CLIENT_SETTINGS = ("client_lr", "step_weights")
"""The settings that act before the release (their derivative needs the second release)."""


def hyper_releases(clip: float, setting_clip: float, z: float, client_side: bool) -> list[Release]:
    """The releases one round of ``source=clients`` adds on the round's cohort (module docstring):
    the held-out gradients, and the setting derivatives where ``client_side``."""
    out = [
        Release(
            "hyper-gradient: clients' held-out gradients (hypergrad.source=clients)",
            "central",
            z,
            f"each client's held-out gradient clipped to L2 norm {clip}",
            bound_value=clip,
        )
    ]
    if client_side:
        out.append(
            Release(
                "hyper-gradient: clients' setting derivatives (hypergrad.source=clients)",
                "central",
                z,
                f"each client's derivative in the client settings clipped to L2 norm"
                f" {setting_clip}",
                bound_value=setting_clip,
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """Each population client's local test data (``FederatedDataset.client_test``), drawn in
    batches of at most ``batch_size`` examples."""

    x: Any
    y: Any
    client_test: tuple
    batch_size: int

    @property
    def width(self) -> int:
        largest = max((len(i) for i in self.client_test), default=0)
        return max(1, min(self.batch_size, largest))

    def batches(self, client_ids, present, seed: int) -> tuple[dict, np.ndarray]:
        """``({x, y}, mask)`` stacked over the cohort's slots: each present client's examples drawn
        without replacement (all of them when it has fewer); absent slots are all masked."""
        width, generator = self.width, np.random.default_rng(seed)
        slots = len(client_ids)
        index = np.zeros((slots, width), np.int64)
        mask = np.zeros((slots, width), bool)
        for s, (client, here) in enumerate(zip(client_ids, present)):
            held = self.client_test[int(client)] if here else ()
            take = min(width, len(held))
            if take:
                index[s, :take] = generator.choice(np.asarray(held), take, replace=False)
                mask[s, :take] = True
        y = np.asarray(self.y)[index]
        return {"x": np.asarray(self.x)[index], "y": y.astype(np.int32)}, mask


def clipped(vector, clip):
    """``vector`` scaled to L2 norm at most ``clip``, or zeros where it is not finite (a client
    whose derivative overflowed sends nothing)."""
    zeros = jax.tree_util.tree_map(jnp.zeros_like, vector)
    finite = tree.where(tree.is_finite(vector), vector, zeros)
    return clip_by_global_norm(finite, clip).clipped


def noised_mean(total, std, denominator, key):
    """(``total`` + N(0, std^2 I)) / ``denominator``, with the rounds' own Gaussian sampler."""
    return jax.tree_util.tree_map(lambda x: x / denominator, add_gaussian_noise(total, std, key))


@dataclasses.dataclass(frozen=True)
class ClientOptions:
    """The ``hypergrad`` keys the client source reads."""

    clip: float
    setting_clip: float
    noise_multiplier: float
    adapt: tuple


def held_out_gradient_sum(per_example_loss, params, batches, masks, clip, key):
    """Release 1's sum before its noise: sum_i clip_C(grad L_i(params)) over the cohort's slots
    (the clients one after another, ``lax.map``; a slot with no held-out example adds 0)."""

    def one(args):
        batch, mask = args
        loss = lambda p: masked_mean(per_example_loss(p, batch, key), mask)  # noqa: E731
        return clipped(jax.grad(loss)(params), clip)

    per_client = jax.lax.map(one, (batches, masks))
    return jax.tree_util.tree_map(lambda g: jnp.sum(g, axis=0), per_client)


def server_part(algorithm, state, mean, g, key):
    """``(grads, u)``: g . dw_{t+1}/dtheta (the server entries; the client settings act before the
    release, their entries here are 0) and u = (dw_{t+1}/dmean)^T g, from the released ``mean`` and
    ``g`` alone (post-processing)."""

    def objective(settings, mean):
        aggregate = Aggregate(mean, jnp.ones(()), jnp.ones((), jnp.int32), fixed=True)
        new_state, _ = algorithm.server_update(state.replace(extra=settings), aggregate, key)
        return optax.tree_utils.tree_vdot(new_state.params, g)

    return jax.grad(objective, argnums=(0, 1))(state.extra, mean)


def setting_derivative_sum(client_fn, shared, settings, clients, u, names, clip):
    """``(total, weight)``: release 2's sum before its noise, sum_j clip_C'(u . dU_j/dtheta_c) over
    the cohort (a dict of the adapted client settings ``names``), and the sum of the clients'
    weights. ``client_fn``: the round's client side, whose summed ``upload`` U_j is what client j
    adds to the sum the mean divides by the weights (or by a fixed D); the clients one after
    another."""
    (base_shared, _), states, inputs = shared

    def one(client):
        def projected(adapted):
            summed, _ = client_fn(((base_shared, {**settings, **adapted}), states, inputs), client)
            return optax.tree_utils.tree_vdot(summed["upload"], u), summed["weight"]

        grad, weight = jax.grad(projected, has_aux=True)({n: settings[n] for n in names})
        return clipped(grad, clip), weight

    per_client, weights = jax.lax.map(one, clients)
    return jax.tree_util.tree_map(lambda g: jnp.sum(g, axis=0), per_client), jnp.sum(weights)


def fixed_denominator(uploads, round_index: int) -> float | None:
    """The chain's fixed denominator D (D_t of a schedule), or None where the mean divides by the
    realised weights."""
    weighting = uploads.weighting
    if weighting is None or not weighting.denominator > 0:
        return None
    return float(weighting.inputs(round_index).get("denominator", weighting.denominator))


class ClientHyperGradient:
    """The hyper-gradient of ``source=clients`` for one round (module docstring), both releases'
    noise drawn from the round's noise key (``rng.Purpose.HYPERGRAD_NOISE``), the held-out batches
    from its key (``rng.Purpose.HYPERGRAD``)."""

    def __init__(self, algorithm, held_out: HeldOut | None, options: ClientOptions):
        self.algorithm, self.held_out, self.options = algorithm, held_out, options
        self.names = tuple(n for n in CLIENT_SETTINGS if n in options.adapt)
        self._programs: dict = {}  # jitted, one per chain specialisation (static_key)

    def __call__(self, runner, previous, result, cohort, key, inputs) -> dict:
        """The hyper-gradient in every setting (a dict like ``previous.extra``; the entries that do
        not adapt are 0 or stale: ``online.step`` moves only the adapted ones). ``previous``,
        ``result``, ``cohort``, ``key``, ``inputs``: the round's (``OnlineHypertuned
        .adapt_settings``)."""
        if self.held_out is None:
            raise ValueError("hypergrad.source='clients' needs the clients' local test data")
        o, t = self.options, int(inputs["round_index"])
        uploads = inputs["uploads"]
        fixed = fixed_denominator(uploads, t)
        present = np.asarray(cohort["num_examples"]) > 0
        # g's D: the fixed one, else the clients that took part (L: the mean of their losses)
        denominator = fixed if fixed is not None else float(max(int(present.sum()), 1))
        noise = jax.random.split(rng.purpose_key(inputs["noise_key"], rng.Purpose.HYPERGRAD_NOISE))
        draw = rng.purpose_key(key, rng.Purpose.HYPERGRAD)
        seed = int(jax.random.randint(draw, (), 0, 2**31 - 1))
        batches, masks = self.held_out.batches(np.asarray(cohort["client_id"]), present, seed)
        total = self._jit("gradient", self._gradient_fn)(result.state.params, batches, masks, draw)
        g = noised_mean(total, o.noise_multiplier * o.clip, denominator, noise[0])
        grads, u = self._jit("server", self._server_fn)(previous, result.released, g, key)
        if not self.names:
            return grads
        _, (clients, *_) = runner.function(previous, cohort, key, **inputs)
        shared = (self.algorithm.broadcast(previous), previous.uploads, uploads.inputs(t))
        program = self._jit(("settings", uploads.static_key()), self._settings_fn(runner, uploads))
        total, weight = program(shared, previous.extra, clients, u)
        # the mean's own divisor: the fixed D, else the realised weights (a run without DP)
        divisor = fixed if fixed is not None else jnp.maximum(weight, 1e-12)
        client = noised_mean(total, o.noise_multiplier * o.setting_clip, divisor, noise[1])
        return {**grads, **client}

    def _jit(self, name, fn):
        if name not in self._programs:
            self._programs[name] = jax.jit(fn)
        return self._programs[name]

    def _gradient_fn(self, params, batches, masks, key):
        loss = self.algorithm.per_example_loss
        return held_out_gradient_sum(loss, params, batches, masks, self.options.clip, key)

    def _server_fn(self, state, mean, g, key):
        return server_part(self.algorithm, state, mean, g, key)

    def _settings_fn(self, runner, uploads):
        client_fn, names = runner.client_function(uploads), self.names
        clip = self.options.setting_clip
        return lambda shared, settings, clients, u: setting_derivative_sum(
            client_fn, shared, settings, clients, u, names, clip
        )
