"""Example-level DP inside local training (seed 003, DP-SCAFFOLD) as a ledger of the one privacy
tracker (``privacy.ledgers.client_level.Ledger``): per-client ledgers with thresholds
(``example_book``).

Before round t: ``eligible`` (clients whose next participation still fits their threshold) and
``step_multipliers`` (each sampled client's step noise multiplier: the typed input of
``Requirements.step_noise``, ``core.round.STEP_NOISE``); after it: ``record``. The run's epsilon is
the largest client's; the report gives the distribution. The local steps' release is the hook's
(``step_dp.ClippedNoisyGradient.step_release``); the upload chain releases nothing.
"""

from __future__ import annotations

import logging

import numpy as np

from fedjax_dp.privacy.ledgers.example_book import LEDGER_PLD_DISCRETIZATION, ExampleBook
from fedjax_dp.privacy.accounting.poisson_truncation import TRUNCATION_SHARE
from fedjax_dp.privacy.mechanisms.step_dp import ClippedNoisyGradient


def _rule(ledger: ExampleBook) -> str:
    if ledger.adaptive:
        return "adaptive"
    if ledger.calibrated:
        return (
            "fixed noise per client: each client's own z, the least whose q T expected"
            " participations fit its threshold, chosen before its first participation and kept"
        )
    return "fixed noise"


class ExampleLedger:
    local = True
    rule = None  # no run-wide budget rule: each client's own threshold decides (``eligible``)

    def __init__(
        self,
        ledger: ExampleBook,
        clip_norm: float,
        per_example: bool,
        median_clip: bool = False,
    ):
        """``median_clip``: the steps clip at their batch's median gradient norm (``step_dp``): the
        ledger then composes what a fixed C would give at the same z, and the run has NO formal
        guarantee."""
        self.ledger, self.clip_norm, self.per_example, self.median_clip = (
            ledger,
            clip_norm,
            per_example,
            median_clip,
        )
        self.rounds, self.formal = 0, not median_clip
        self._chosen = None  # (round, ids, z) of step_multipliers, recorded as run

    def eligible(self, t: int, releases=()) -> np.ndarray:
        before = self.ledger.stopped_round > 0
        eligible = self.ledger.eligible(t)
        stopped = np.flatnonzero((self.ledger.stopped_round > 0) & ~before)
        if len(stopped):
            logging.info(
                "round %d: clients %s reached their privacy-loss thresholds and stop contributing",
                t,
                stopped.tolist(),
            )
        return eligible

    def allows(self, t: int, releases=()) -> bool:
        return True  # each client's own threshold decides (``eligible``); no run-wide rule

    def step_multipliers(self, t: int, client_ids, slots: int) -> np.ndarray:
        """Each cohort slot's step noise multiplier for round t (padding slots 0)."""
        chosen = self.ledger.multipliers(client_ids, t)
        self._chosen = (t, tuple(int(i) for i in client_ids), chosen)
        z = np.zeros(slots, np.float32)
        z[: len(client_ids)] = chosen
        return z

    def record(self, t: int, client_ids, releases=()) -> None:
        ids = tuple(int(i) for i in client_ids)
        if self._chosen is not None and self._chosen[:2] == (t, ids):
            self.ledger.record(ids, t, self._chosen[2])  # the z the clients ran with
        # a resume replaying the history: the same state gives the same z; mark stops as the run did
        else:
            self.ledger.eligible(t)
            self.ledger.record(ids, t)
        self.rounds += 1

    def composed(self) -> dict:
        """What has been composed so far, as a checkpoint records it and a resume's replay must
        reproduce."""
        led = self.ledger
        return {
            "rounds": self.rounds,
            "noise_multipliers": [float(z) for z in led.multipliers_used],
            "steps": int(led.steps_run.sum()),
            "epsilon": float(self.epsilon()),
        }

    def epsilons(self) -> np.ndarray:
        return self.ledger.epsilons()

    def epsilon(self) -> float:
        eps = self.ledger.epsilons()
        return float(eps.max()) if len(eps) else 0.0

    def stopped_clients(self) -> dict:
        """``{client id: the round before which it stopped}`` for clients out of budget."""
        return {int(k): int(r) for k, r in enumerate(self.ledger.stopped_round) if r}

    def describe(self) -> dict:
        """The report's fields (the tracker adds the generic ones)."""
        led = self.ledger
        eps = led.epsilons()
        took_part = led.steps_run > 0
        limited = np.isfinite(led.thresholds)
        spread = {
            "max": float(eps.max()),
            "mean_of_participants": float(eps[took_part].mean()) if took_part.any() else 0.0,
            "quantiles_of_participants": (
                np.quantile(eps[took_part], [0, 0.25, 0.5, 0.75, 1]).tolist()
                if took_part.any()
                else []
            ),
            "thresholds_min_max": (
                [float(led.thresholds[limited].min()), float(led.thresholds[limited].max())]
                if limited.any()
                else None
            ),
            "stopped_before_round": {str(k): r for k, r in self.stopped_clients().items()},
        }
        clip = "each example's gradient" if self.per_example else "the minibatch gradient"
        bound = f"C = {self.clip_norm}"
        if self.median_clip:
            clip, bound = (
                "each example's gradient at the batch's median gradient norm",
                "C = the batch's median norm",
            )
        z = sorted(set(np.round(led.multipliers_used, 6).tolist()))
        poisson = led.step_sampling == "poisson"
        if poisson:
            drawn = (
                "a step takes each of the client's n_k examples with probability B / n_k (B ="
                f" {led.batch_size}), padded to {led.batch_cap} slots: a Poisson-subsampled"
                " Gaussian (add/remove one example, sensitivity"
                f" {'C' if self.per_example else '2C'}); a batch over {led.batch_cap} is cut at"
                " random (probability eta_k over a client's steps, at most"
                f" {led.step_tails.max():.3g} a step), which costs (1 + e^epsilon) eta_k of delta:"
                " each client's epsilon is the least whose charge fits in delta (the cap keeps it"
                f" <= {TRUNCATION_SHARE} delta at epsilon {led.design_epsilon:.6g})"
            )
        else:
            drawn = (
                f"a step draws B = {led.batch_size} of the client's n_k examples without"
                " replacement: a subsampled Gaussian (replace-one, sensitivity 2C)"
            )
        accountant = (
            "dp_accounting RDP"
            if led.accountant == "rdp"
            else (
                f"dp_accounting PLD (discretisation {LEDGER_PLD_DISCRETIZATION}; each client's"
                " epsilon is min(PLD, RDP), both bounds of the same mechanism; the schedule and"
                " stops use PLD)"
            )
        )
        notes = [
            (
                f"every local step clips {clip} ({bound}) and adds N(0, (z C)^2); {drawn}; composed"
                f" over the steps each client ran with {accountant}"
            ),
            (
                f"threshold rule ({_rule(led)}): z in [{led.base_multiplier}, {led.max_multiplier}]"
                " per participation; a client whose next participation would exceed its threshold"
                " is no longer sampled; no client's epsilon exceeds its threshold"
                if limited.any()
                else (
                    f"no threshold: fixed z = {led.base_multiplier}, every client keeps taking part"
                )
            ),
            (
                f"{int((led.stopped_round > 0).sum())} of {len(eps)} clients stopped (threshold"
                " reached)"
            ),
            (
                "the guarantee protects each example of each client's data from everyone who sees"
                " the uploads (the server included): example-level local DP, not client-level"
            ),
        ]
        if self.median_clip:
            notes.append(
                "the clip threshold is each step's median per-example gradient norm, computed from"
                " the data and not privatised: NO formal guarantee; the epsilons are what a fixed C"
                " would give at the same noise multiplier"
            )
        truncation = {}
        if poisson:
            eta = led.steps_run * led.step_tails
            truncation = {
                "truncation": {
                    "design_epsilon": led.design_epsilon,
                    "design_share_of_delta": TRUNCATION_SHARE,
                    "step_tail_max": float(led.step_tails.max()),
                    "charged_delta_max": float(np.max((1 + np.exp(np.minimum(eps, 700.0))) * eta)),
                }
            }
        step = ClippedNoisyGradient(
            self.clip_norm,
            z[0] if z else led.base_multiplier,
            self.per_example,
            median_clip=self.median_clip,
        ).step_release()
        release = {
            **step.declared(),
            "steps_per_participation": led.steps,
            "noise_multipliers": [float(v) for v in (z[:1] + z[-1:] if len(z) > 2 else z)],
        }
        return {
            "mechanism": (
                "per-step clipped gradient + Gaussian"
                f" ({'per example' if self.per_example else 'per batch'})"
            ),
            "unit": "example",
            "neighboring_relation": "add-or-remove-one" if poisson else "replace-one",
            "sampling": (
                "per step:"
                f" {'Poisson, rate B / n_k' if poisson else 'B of n_k without replacement'}"
            ),
            "noise_mode": "local (every step)",
            "accountant": f"per-client {led.accountant.upper()} ledger",
            "epsilons": {
                f"per_client_{led.accountant}_max": float(eps.max()),
                "per_client": spread,
            },
            "noise_multipliers": z[:1] + z[-1:] if len(z) > 2 else z,
            "sampling_rates": [
                led.batch_size / int(led.client_sizes.max()),
                led.batch_size / int(led.client_sizes.min()),
            ],
            "notes": notes,
            "releases": [release],
            "accounting": {
                "rdp_orders": list(led.orders),
                "noise_grid_points": len(led.grid),
                "step_sampling": led.step_sampling,
                "batch_cap": led.batch_cap,
                **({} if poisson else {"accounting_delta": led.delta}),
                **truncation,
            },
        }
