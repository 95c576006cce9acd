"""Local mini-batch gradient DP with per-client cumulative privacy-loss thresholds and
history-weighted, correlation-weighted aggregation (seed 003, a patent:
"一种基于本地小批量梯度差分隐私的联邦学习方法";
ALGORITHMS.md Sec. 3).

The patent's formulas are images missing from its text; this is the reading implemented, each choice
stated:

* Client (steps s3-s5, claim 3): from w_t, S local steps; step i draws a batch of B of the client's
  n_k examples without replacement (independently per step: the sampling the accountant composes;
  ``ldp.step_sampling = 'poisson'``: each example with probability B / n_k, padded to a cap whose
  overflow is charged to delta, see ``privacy.ledgers.example_book``),
  clips each example's gradient to C (``ldp.per_example``; or the batch's mean gradient), sums, adds
  N(0, (z C)^2 I), divides by B and steps with learning rate gamma (``client.learning_rate``; 0.01
  in the patent's experiment): w <- w - gamma (sum_i clip(g_i) + N(0, z^2 C^2 I)) / B
  (``privacy.mechanisms.step_dp.ClippedNoisyGradient``). It uploads Delta_k = w_k - w_t.
* Threshold (claim 2): client n's cumulative loss over the steps it ran is accounted per client
  (``privacy.ledgers.example_book``: subsampled Gaussian per step, RDP, replace-one); its noise
  multiplier z for the next participation is the least that keeps the loss of its expected remaining
  participations under its threshold epsilon_n, within [z_0, z_max]; a client whose next
  participation would exceed epsilon_n stops contributing (no longer sampled; logged).
  ``ldp.adaptive = False``: fixed z_0; with ``ldp.fixed_noise = 'calibrated'`` each client's own
  fixed z, calibrated to its size and threshold (the fixed-noise baseline for clients of unequal
  sizes; ``privacy.ledgers.example_book``).
* Server (step s6, claim 4): w_{t+1} = (1 - alpha) w_t + alpha sum_k a_k w_k = w_t + alpha sum_k a_k
  Delta_k, with a_k = softmax_k(tau cos(Delta_k, mean Delta)) (``core.correlation_weights``;
  ``ldp.weighting = 'uniform'``: a_k = 1/K). The global model is validated on a server-held set held
  out of every client's data (``server_data.overlap = 0``), reported as ``validation_accuracy``.
* Model (claim 5): two units of conv -> ReLU -> max-pool, two dense layers, softmax (``model.name =
  'cnn_fedavg'``, McMahan et al.'s CNN, which has this structure).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core import tree
from fedjax_dp.core.algorithm import ClientOut, Requirements, lr_scale
from fedjax_dp.core.correlation_weights import CorrelationWeights
from fedjax_dp.core.local_training import make_local_trainer
from fedjax_dp.core.optimizers import build_optimizer
from fedjax_dp.core.round import STEP_NOISE
from fedjax_dp.core.uploads import UniformWeights, chain
from fedjax_dp.privacy.accounting import poisson_truncation
from fedjax_dp.privacy import settings
from fedjax_dp.privacy.accounting.accountant import parse_rdp_orders
from fedjax_dp.privacy.ledgers.example_book import (
    LEDGER_ORDERS,
    STEP_SAMPLINGS,
    ExampleBook,
)
from fedjax_dp.privacy.ledgers.example_ledger import ExampleLedger
from fedjax_dp.privacy.mechanisms.step_dp import ClippedNoisyGradient

WEIGHTINGS = ("correlation", "uniform")
FIXED_NOISE = ("z0", "calibrated")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LdpMinibatch(FedAvg):
    """FedAvg whose every local step is a clipped, noised gradient with the client's own z. Its own
    fields are keyword-only: a field added to FedAvg must not shift them (it once did: FedAvg's
    ``deferred_dense_rate`` took ``clip_norm``'s place, and the clients ran ``batch_size``
    steps)."""

    clip_norm: float = 1.0
    per_example: bool = True
    local_steps: int = 10
    batch_size: int = 0  # B: the expected Poisson batch, which the noised sum is divided by
    # > 0: Poisson step batches padded to this (0: B without replacement)
    poisson_batch_cap: int = 0

    @property
    def requirements(self) -> Requirements:
        return Requirements(
            sampled_steps=self.local_steps,
            poisson_batch_cap=self.poisson_batch_cap,
            per_example_gradients=self.per_example,
            step_noise=True,
        )

    def client_update(self, shared, client, client_state, key) -> ClientOut:
        params, round_index = shared
        # z: the client's, per round
        hook = ClippedNoisyGradient(
            self.clip_norm,
            1.0,
            self.per_example,
            normalizer=self.batch_size if self.poisson_batch_cap else 0,
        )
        train = make_local_trainer(
            self.per_example_loss, self.client_optimizer, unroll=self.unroll, gradient_hook=hook
        )
        trained, stats = train(
            params,
            client["batches"],
            client["mask"],
            client["key"],
            lr_scale(self.client_lr_decay, round_index),
            noise_key=client["noise_key"],
            noise_multiplier=client[STEP_NOISE],
        )
        delta = jax.tree_util.tree_map(jnp.subtract, trained, params)
        ok = tree.is_finite(delta) & jnp.isfinite(stats.loss)
        return ClientOut(delta, jnp.float32(1.0), None, stats.loss, ok)


def parse_thresholds(text: str, num_clients: int, seed: int) -> np.ndarray:
    """``ldp.thresholds``: "4" (every client), "1,2,4,8" (each client one of the listed values,
    assigned at random with the run's seed, equally often) -> epsilon_n per client."""
    values = [float(v) for v in str(text).split(",") if v.strip()]
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"ldp.thresholds={text!r}: every threshold epsilon_n must be > 0")
    assigned = np.resize(np.asarray(values), num_clients)
    return np.random.default_rng([seed, 3]).permutation(assigned)


def check_ldp(cfg, need) -> None:
    c = cfg.ldp
    need(c.clip_norm > 0, f"ldp.clip_norm C must be > 0, got {c.clip_norm}")
    need(
        0 < c.noise_multiplier <= c.max_noise_multiplier,
        f"need 0 < ldp.noise_multiplier (z_0={c.noise_multiplier}) <= ldp.max_noise_multiplier"
        f" ({c.max_noise_multiplier})",
    )
    need(
        c.fixed_noise in FIXED_NOISE,
        f"ldp.fixed_noise {c.fixed_noise!r} unknown; use one of {FIXED_NOISE}",
    )
    need(
        not (c.adaptive and c.fixed_noise == "calibrated"),
        "ldp.fixed_noise='calibrated' is the fixed-noise baseline (one z per client, kept): set"
        f" ldp.adaptive=False, got ldp.adaptive={c.adaptive}",
    )
    need(0 < c.alpha <= 1, f"ldp.alpha must lie in (0, 1], got {c.alpha}")
    need(c.temperature >= 0, f"ldp.temperature tau must be >= 0, got {c.temperature}")
    need(
        c.weighting in WEIGHTINGS, f"ldp.weighting {c.weighting!r} unknown; use one of {WEIGHTINGS}"
    )
    need(c.local_steps >= 1, f"ldp.local_steps S must be >= 1, got {c.local_steps}")
    need(
        c.step_sampling in STEP_SAMPLINGS,
        f"ldp.step_sampling {c.step_sampling!r} unknown; use one of {STEP_SAMPLINGS}",
    )
    need(
        cfg.server_data.overlap == 0,
        f"server_data.overlap={cfg.server_data.overlap}: ldp_minibatch validates on a server-held"
        " set that must be held out of every client's data (overlap 0); a set drawn from the"
        " clients would be their data",
    )
    try:
        parse_thresholds(c.thresholds, max(cfg.data.num_clients, 1), cfg.seed)
    except ValueError as error:
        need(False, str(error))


def build_ldp_minibatch(ctx) -> tuple:
    c, cfg = ctx.cfg.ldp, ctx.cfg
    cap = 0
    if c.step_sampling == "poisson":
        if ctx.client_sizes is None:
            raise ValueError(
                "ldp.step_sampling='poisson' needs the clients' data sizes to size its batches"
            )
        design = poisson_truncation.design_epsilon(
            parse_thresholds(c.thresholds, ctx.num_clients, cfg.seed)
        )
        cap = poisson_truncation.batch_cap(
            ctx.client_sizes,
            cfg.client.batch_size,
            cfg.rounds * c.local_steps,
            cfg.privacy.delta,
            design,
        )
    algorithm = LdpMinibatch(
        per_example_loss=ctx.model.per_example_loss,
        client_optimizer=ctx.client_optimizer(),
        server_optimizer=build_optimizer("sgd", c.alpha, 0.0),
        client_lr_decay=cfg.client.lr_decay,
        unroll=ctx.unroll,
        clip_norm=c.clip_norm,
        per_example=c.per_example,
        local_steps=c.local_steps,
        batch_size=cfg.client.batch_size,
        poisson_batch_cap=cap,
    )
    # the plain mean: no cohort-level step, uploads summed inside the engine
    if c.weighting == "uniform":
        return algorithm, chain(UniformWeights())
    return algorithm, chain(CorrelationWeights(c.temperature), UniformWeights())


def make_ledger(cfg, dataset, algorithm) -> ExampleLedger:
    """The per-client ledgers of a run (sizes known once the data is loaded; B checked against
    them). The steps, their sampling and the clip are the built clients' (``algorithm``), what runs;
    the thresholds and noise schedule are the ledger's own (it hands each client its z)."""
    c, s = cfg.ldp, cfg.sampling
    clients = registry.unwrap(algorithm, LdpMinibatch)
    rate = s.cohort_size / dataset.num_clients if s.method == "uniform" else s.rate
    orders = parse_rdp_orders(cfg.privacy.rdp_orders, default=LEDGER_ORDERS)
    ledger = ExampleBook(
        client_sizes=dataset.train_sizes(),
        batch_size=cfg.client.batch_size,
        steps=clients.local_steps,
        thresholds=parse_thresholds(c.thresholds, dataset.num_clients, cfg.seed),
        delta=cfg.privacy.delta,
        base_multiplier=c.noise_multiplier,
        max_multiplier=c.max_noise_multiplier,
        participation_rate=rate,
        rounds=cfg.rounds,
        adaptive=c.adaptive,
        orders=orders,
        step_sampling="poisson" if clients.poisson_batch_cap else "fixed",
        per_example=clients.per_example,
        accountant=cfg.privacy.accountant,
        calibrated=c.fixed_noise == "calibrated",
    )
    if clients.poisson_batch_cap and ledger.batch_cap != clients.poisson_batch_cap:
        raise ValueError(
            f"the ledger's Poisson batch cap {ledger.batch_cap} is not the clients' "
            f"{clients.poisson_batch_cap}: it would account batches that did not run"
        )
    return ExampleLedger(ledger, clients.clip_norm, clients.per_example)


SECTION_DOCS = {  # what each key of the section means (``fedjax-dp --help``)
    "clip_norm": "local mini-batch DP: C, per example (or per batch)",
    "per_example": "local mini-batch DP: False clips the batch's mean gradient (sensitivity 2C)",
    "noise_multiplier": "local mini-batch DP: z_0, the least noise a step gets",
    "max_noise_multiplier": (
        "local mini-batch DP: z_max; a client that cannot afford a participation at it stops"
    ),
    "adaptive": (
        "local mini-batch DP: the threshold-driven noise schedule (False: fixed noise, same stop"
        " rule)"
    ),
    "fixed_noise": (
        "local mini-batch DP, adaptive=False: z0 (every client at z_0) | calibrated (each client's"
        " own z for its q T expected participations and threshold, kept for the run)"
    ),
    "thresholds": (
        "local mini-batch DP: per-client epsilon thresholds epsilon_n, one value or a comma list"
    ),
    "local_steps": (
        "local mini-batch DP: steps S per participation, each a fresh batch of client.batch_size"
    ),
    "alpha": "local mini-batch DP: history weight, w_{t+1} = (1 - alpha) w_t + alpha sum_k a_k w_k",
    "weighting": (
        "local mini-batch DP: correlation (softmax of cosine to the mean update) | uniform"
    ),
    "temperature": "local mini-batch DP: tau of a_k = softmax(tau cos(Delta_k, mean Delta))",
    "step_sampling": (
        "local mini-batch DP: fixed (B without replacement per step) | poisson (each example w.p. "
        "B/n_k)"
    ),
}
registry.register_section(
    "ldp",
    docs=SECTION_DOCS,
    defaults={
        "clip_norm": 1.0,
        "per_example": True,
        "noise_multiplier": 1.0,
        "max_noise_multiplier": 8.0,
        "adaptive": True,
        "fixed_noise": "z0",
        "thresholds": "4.0",
        "local_steps": 10,
        "alpha": 1.0,
        "weighting": "correlation",
        "temperature": 1.0,
        "step_sampling": "fixed",
    },
)
registry.register(
    "ldp_minibatch",
    build=build_ldp_minibatch,
    sections=("ldp",),
    validate=check_ldp,
    server_validation=True,
    ledger=make_ledger,
    privacy_keys=settings.ACCOUNTING,
    unread=registry.SAMPLED_STEPS + registry.OWN_SERVER_STEP,
    summary=(
        "Local mini-batch gradient DP with per-client thresholds and history/correlation-weighted "
        "aggregation (seed 003)"
    ),
)
