"""DP-SCAFFOLD (Noble, Bellet, Dieuleveut 2022, "Differentially Private Federated Learning on
Heterogeneous Data", AISTATS, Alg. 1), a CUAG-PFL baseline (seed 004 §7.2.3 item 5, §7.2.4;
ALGORITHMS.md §4): SCAFFOLD (``scaffold``, option II) whose every local step is DP-SGD.

Client i, from y = x, K local steps (``dp_scaffold.local_steps``), each on a fresh batch of B of its
n_i examples drawn without replacement (the subsampling the accountant composes):
    H = (1 / B) (sum_j clip_C(grad l(y; z_j)) + N(0, (sigma_g C)^2 I)),  y <- y - eta_l (H - c_i +
    c)
(``privacy.mechanisms.step_dp.ClippedNoisyGradient``; the correction c - c_i touches no data). The
control update c_i+ = c_i - c + (x - y) / (K eta_l), both uploads (Delta y, Delta c: twice FedAvg's
traffic) and the server step are post-processing of the noised steps, so each client's guarantee is
example-level local DP (no trusted server), composed per client over the steps it ran by the
per-client ledgers of ``privacy.ledgers.example_book`` (RDP or PLD, replace-one, sensitivity 2C).

Seed 004's settings: sigma_g = 1.0 fixed, and "the median of the gradient norms in each local
training as the clip threshold" (``dp_scaffold.clip = 'median'``: C = each step's median per-example
gradient norm). That threshold is computed from the raw data and released through the noise scale,
so the median clip has NO formal guarantee (``formal: false``; the epsilon shown is what a fixed C
would give at the same sigma_g). ``clip = 'fixed'`` (C = ``dp_scaffold.clip_norm``, seed 004's
"fixed clip 1") is the sound variant, Noble et al.'s own algorithm. The noise is fixed, so epsilon
grows with the rounds (seed 004 reports [1.52, 26.28] over 300 rounds);
``privacy.client_epsilon_budget`` > 0 stops a client before its next participation would pass it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.scaffold import Scaffold, check_scaffold, correction_regularizer
from fedjax_dp.core.algorithm import Requirements
from fedjax_dp.core.local_training import make_local_trainer
from fedjax_dp.core.round import STEP_NOISE
from fedjax_dp.privacy import settings
from fedjax_dp.privacy.accounting.accountant import parse_rdp_orders
from fedjax_dp.privacy.ledgers.example_book import LEDGER_ORDERS, ExampleBook
from fedjax_dp.privacy.ledgers.example_ledger import ExampleLedger
from fedjax_dp.privacy.mechanisms.step_dp import ClippedNoisyGradient

CLIPS = ("fixed", "median")


# its own fields by keyword: a new Scaffold field cannot shift them
@dataclasses.dataclass(frozen=True, kw_only=True)
class DpScaffold(Scaffold):
    """SCAFFOLD whose local steps are clipped, noised gradients at the client's z (from its
    ledger)."""

    clip_norm: float = 1.0
    local_steps: int = 25
    median_clip: bool = False

    @property
    def requirements(self) -> Requirements:
        return Requirements(
            client_state=True,
            sampled_steps=self.local_steps,
            per_example_gradients=True,
            step_noise=True,
        )

    def local_training(self, params, client, correction, key, scale):
        hook = ClippedNoisyGradient(
            self.clip_norm, 1.0, per_example=True, median_clip=self.median_clip
        )
        train = make_local_trainer(
            self.per_example_loss,
            self.client_optimizer,
            unroll=self.unroll,
            regularizer=correction_regularizer(correction),
            gradient_hook=hook,
        )
        return train(
            params,
            client["batches"],
            client["mask"],
            key,
            scale,
            noise_key=client["noise_key"],
            noise_multiplier=client[STEP_NOISE],
        )


def build_dp_scaffold(ctx) -> tuple:
    c, d = ctx.cfg, ctx.cfg.dp_scaffold
    return (
        DpScaffold(
            ctx.model.per_example_loss,
            ctx.client_optimizer(),
            local_learning_rate=c.client.learning_rate,
            num_clients=ctx.num_clients,
            **ctx.client_fields(),
            clip_norm=d.clip_norm,
            local_steps=d.local_steps,
            median_clip=d.clip == "median",
        ),
        (),
    )


def make_ledger(cfg, dataset, algorithm) -> ExampleLedger:
    """Per-client example-level ledgers at the fixed sigma_g (no threshold unless one is set); the
    steps and the clip are the built clients' (``algorithm``), what runs."""
    d, s = cfg.dp_scaffold, cfg.sampling
    clients = registry.unwrap(algorithm, DpScaffold)
    rate = s.cohort_size / dataset.num_clients if s.method == "uniform" else s.rate
    threshold = cfg.privacy.client_epsilon_budget or np.inf
    ledger = ExampleBook(
        client_sizes=dataset.train_sizes(),
        batch_size=cfg.client.batch_size,
        steps=clients.local_steps,
        thresholds=threshold,
        delta=cfg.privacy.delta,
        base_multiplier=d.noise_multiplier,
        max_multiplier=d.noise_multiplier,
        participation_rate=rate,
        rounds=cfg.rounds,
        adaptive=False,
        orders=parse_rdp_orders(cfg.privacy.rdp_orders, default=LEDGER_ORDERS),
        accountant=cfg.privacy.accountant,
    )
    return ExampleLedger(
        ledger, clients.clip_norm, per_example=True, median_clip=clients.median_clip
    )


def check_dp_scaffold(cfg, need) -> None:
    check_scaffold(cfg, need)
    d = cfg.dp_scaffold
    need(d.clip in CLIPS, f"dp_scaffold.clip {d.clip!r} unknown; use one of {CLIPS}")
    need(d.clip_norm > 0, f"dp_scaffold.clip_norm C must be > 0, got {d.clip_norm}")
    need(
        d.noise_multiplier > 0,
        f"dp_scaffold.noise_multiplier sigma_g must be > 0, got {d.noise_multiplier}",
    )
    need(d.local_steps >= 1, f"dp_scaffold.local_steps K must be >= 1, got {d.local_steps}")


SECTION_DOCS = {  # what each key of the section means (``fedjax-dp --help``)
    "clip": (
        "DP-SCAFFOLD: median (each step's median gradient norm, as seed 004: NO formal guarantee) |"
        " fixed"
    ),
    "clip_norm": "DP-SCAFFOLD: C per example of clip='fixed'",
    "noise_multiplier": "DP-SCAFFOLD: sigma_g, step noise N(0, (sigma_g C)^2 I) (seed 004: 1.0)",
    "local_steps": "DP-SCAFFOLD: K local steps, each a fresh batch of client.batch_size",
}
registry.register_section(
    "dp_scaffold",
    docs=SECTION_DOCS,
    defaults={
        "clip": "median",
        "clip_norm": 1.0,
        "noise_multiplier": 1.0,
        "local_steps": 25,
    },
)
registry.register(
    "dp_scaffold",
    build=build_dp_scaffold,
    sections=("dp_scaffold",),
    validate=check_dp_scaffold,
    ledger=make_ledger,
    privacy_keys=settings.ACCOUNTING + ("client_epsilon_budget",),
    unread=registry.SAMPLED_STEPS,
    summary=(
        "DP-SCAFFOLD (Noble et al. 2022): SCAFFOLD with DP-SGD local steps, per-client "
        "example-level ledgers"
    ),
)
