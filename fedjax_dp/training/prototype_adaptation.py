"""Prototype adaptation ("Proto A.") of a global classifier: the personalised metric that the PFLDyn
authors' code (Acar et al. 2021, alpemreacar/PFL ``get_proto_acc_loss``) reports for methods that
train one global model (FedAvg, SCAFFOLD: "No Per., ... - Proto A."), and the metric seed 004 §7.2
states for SCAFFOLD and DP-SCAFFOLD ("each participant's personalised model on its local data").

Each client builds class prototypes from the global model's penultimate features (the last hidden
layer after its ReLU) of its whole training data and labels its test examples by the nearest
prototype (``core.prototypes``); nothing is trained. Turned on by ``eval_prototypes``; the global
model's own accuracy is still reported beside it.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from fedjax_dp.core.algorithm import Requirements
from fedjax_dp.core.prototypes import prototype_correct


@dataclasses.dataclass(frozen=True)
class PrototypeAdaptation:
    """``personalized_correct`` for ``training.personalized_evaluation`` from a classifier
    ``model``."""

    model: object
    requirements: ClassVar[Requirements] = Requirements()

    def personalized_correct(self, state, client_state, train: dict, test: dict):
        features = lambda x: self.model.apply(state.params, x, penultimate=True)  # noqa: E731
        return prototype_correct(
            features(train["x"]),
            train["y"],
            train["mask"],
            features(test["x"]),
            test["y"],
            self.model.num_classes,
        )
