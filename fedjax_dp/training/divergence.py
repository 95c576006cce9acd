"""Stopping a run that has diverged, DP or not.

A non-DP run whose global model turns non-finite stops at once (``loop``). A DP run does not get
there: clipping maps infinite or huge updates to the bound and the noise keeps the model finite, so
a run with a learning rate of 1e9, or noise that drowns every update, trained at chance to its last
round, spending epsilon, with no word of it. ``DivergenceMonitor`` watches the cohort's training
loss (the mean local objective, ``train_loss``): the run has diverged once it is non-finite, or
above ``FACTOR`` times its baseline, for ``window`` rounds in a row (``divergence_rounds``; 0 turns
the rule off). The baseline is the initial model's test loss where the run evaluated it (round 0:
the lr = 1e9 run's training loss was already 2.9e26 in round 1, against 2.3 at round 0), else the
first round's training loss. The training loss is computed from raw client data and is listed
outside the guarantee in ``privacy.json``; so is this decision, which is a function of it.
"""

from __future__ import annotations

import dataclasses
import math

FACTOR = 1e6
"""How far above the first round's training loss counts as exploding. The cases seen: a
learning rate of 1e9 under DP-FedAvg (about 3e26, from 2.3) and local noise at z = 9.67 (1.05e8 by
round 20) are 1e7 and more above; CUAG-PFL's local objective with its regulariser legitimately rises
6e4-fold in a 3-round golden run while its personalised accuracy holds at 0.8, so a smaller factor
would stop a run that is learning."""


@dataclasses.dataclass
class DivergenceMonitor:
    window: int
    baseline: float | None = None
    baseline_from: str = ""
    streak: int = 0

    def __post_init__(self):
        if self.window < 0:
            raise ValueError(f"divergence_rounds must be >= 0 (0: off), got {self.window}")

    def start(self, initial_test_loss: float | None) -> None:
        """The initial model's test loss (round 0) as the baseline, where the run evaluated it."""
        if (
            self.baseline is None
            and initial_test_loss is not None
            and math.isfinite(initial_test_loss)
        ):
            self.baseline, self.baseline_from = (
                max(abs(initial_test_loss), 1e-12),
                "the initial model's test loss",
            )

    def observe(self, round_index: int, loss: float | None) -> str | None:
        """Records one round's training loss; returns the stop reason once the run has diverged."""
        if not self.window or loss is None:
            return None
        finite = math.isfinite(loss)
        if self.baseline is None and finite:
            self.baseline, self.baseline_from = max(abs(loss), 1e-12), "round 1's training loss"
        exploding = not finite or (self.baseline is not None and abs(loss) > FACTOR * self.baseline)
        self.streak = self.streak + 1 if exploding else 0
        if self.streak < self.window:
            return None
        return (
            "the training diverged: the training loss was"
            f" {'non-finite' if not finite else f'{loss:.3g}'} (over {FACTOR:g} x"
            f" {self.baseline_from}, {self.baseline:.3g}) for {self.window} rounds in a row, to"
            f" round {round_index}"
        )

    def state(self) -> dict:
        return {
            "baseline": self.baseline,
            "baseline_from": self.baseline_from,
            "streak": self.streak,
        }

    def load(self, saved: dict | None) -> None:
        if saved:
            self.baseline, self.baseline_from, self.streak = (
                saved["baseline"],
                saved["baseline_from"],
                saved["streak"],
            )
