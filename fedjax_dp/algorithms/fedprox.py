"""FedProx (Li et al. 2020, "Federated Optimization in Heterogeneous Networks", Eq. 2): FedAvg whose
local objective carries the proximal term

    h_k(w; w_t) = F_k(w) + (mu / 2) ||w - w_t||^2,

which keeps local models near the round's global model. The seed-002 baseline uses mu = 2e-4
(ALGORITHMS.md §2). With mu = 0 it is FedAvg exactly.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.fedavg import FedAvg


def proximal_term(mu: float):
    """``R(w, w_t) = mu / 2 ||w - w_t||^2``; each local step differentiates it in ``w`` only, and a
    trajectory differentiated in w_t (UGA) sees the anchor's dependence on w_t too, as it should."""

    def regularizer(params, initial_params):
        squares = jax.tree_util.tree_map(
            lambda w, a: jnp.sum(jnp.square(w - a)), params, initial_params
        )
        # not norm**2: sqrt has no gradient at 0
        return 0.5 * mu * sum(jax.tree_util.tree_leaves(squares))

    return regularizer


# its own fields by keyword: a new FedAvg field cannot shift them
@dataclasses.dataclass(frozen=True, kw_only=True)
class FedProx(FedAvg):
    mu: float = 2e-4

    def __post_init__(self):
        if not self.mu >= 0:
            raise ValueError(f"FedProx mu must be >= 0, got {self.mu}")
        super().__post_init__()

    def regularizer(self):
        return proximal_term(self.mu) if self.mu > 0 else None


def build_fedprox(ctx) -> tuple:
    c = ctx.cfg
    return (
        FedProx(
            ctx.model.per_example_loss,
            ctx.client_optimizer(),
            **ctx.client_fields(),
            mu=c.fedprox.mu,
        ),
        (),
    )


def check_fedprox(cfg, need) -> None:
    need(cfg.fedprox.mu >= 0, f"fedprox.mu must be >= 0, got {cfg.fedprox.mu}")


SECTION_DOCS = {  # what each key of the section means (``fedjax-dp --help``)
    "mu": "FedProx: proximal coefficient mu",
}
# the seed-002 baseline's proximal coefficient
registry.register_section("fedprox", docs=SECTION_DOCS, defaults={"mu": 2e-4})
registry.register(
    "fedprox",
    build=build_fedprox,
    sections=("fedprox",),
    validate=check_fedprox,
    privacy_keys=(),
    scaled_rates=True,
    summary="FedProx (Li et al. 2020): FedAvg with a proximal term",
)
