"""Accounting from the events that ran: a mechanism, an event and a sampler defined in this file
alone, with no edit of the package, are accounted by their own dp_accounting events; an event no
accountant can compose is refused before any data loads; the Gaussian fast path equals the generic
one; the objects refuse what the config refuses."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import ClassVar

import attr
import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core.release import Release
from fedjax_dp.core.uploads import (
    BoundMapping,
    ClientContext,
    Flow,
    ServerContext,
    UploadTransform,
    chain,
)
from fedjax_dp.core.uploads import fixed_denominator
from fedjax_dp.privacy import UnsupportedEventError, register_event, register_sampler
from fedjax_dp.privacy.accounting import events
from fedjax_dp.privacy.accounting.accountant import Accountant, RoundEvent
from fedjax_dp.privacy.ledgers.client_level import round_mechanism
from fedjax_dp.privacy.sampling import unregister_sampler
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment

DELTA = 1e-6


@dataclasses.dataclass(frozen=True)
class L1Clip(BoundMapping, UploadTransform):
    """Each upload scaled to L1 norm at most S (what a Laplace mechanism's sensitivity needs)."""

    kind: ClassVar[str] = "clip"
    clip_norm: float = 0.5

    def bound_after(self, bound, state, inputs):
        return jnp.float32(self.clip_norm)

    def client(self, upload, ctx: ClientContext) -> Flow:
        norm = sum(jnp.sum(jnp.abs(x)) for x in jax.tree_util.tree_leaves(upload))
        scale = jnp.minimum(1.0, self.clip_norm / jnp.maximum(norm, 1e-12))
        return Flow(
            jax.tree_util.tree_map(lambda x: x * scale, upload), jnp.float32(self.clip_norm)
        )


@dataclasses.dataclass(frozen=True)
class ToyLaplace(UploadTransform):
    """Laplace noise of scale b S on the cohort's sum: ``LaplaceDpEvent(b)`` per round."""

    kind: ClassVar[str] = "noise"
    b: float = 5.0
    event: object = None  # the event it declares (None: the Laplace of b)
    name: str = "toy Laplace"

    def server(self, total, ctx: ServerContext):
        key = jax.random.fold_in(ctx.noise_key, 7)
        leaves, treedef = jax.tree_util.tree_flatten(total)
        keys = jax.random.split(key, len(leaves))
        noised = [
            x + self.b * ctx.bound * jax.random.laplace(k, x.shape, x.dtype)
            for x, k in zip(leaves, keys)
        ]
        return jax.tree_util.tree_unflatten(treedef, noised), ctx.state, {}

    def releases(self, inputs, bound=math.nan):
        event = self.event or dp_accounting.LaplaceDpEvent(self.b)
        return (Release(self.name, "central", self.b, "L1 clip S", bound_value=bound, event=event),)


def _config(algorithm: str, method: str = "poisson", rate: float = 0.3, accountant: str = "pld"):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every, c.model.name = algorithm, 3, 3, "logistic"
    c.data.num_clients = 10
    c.client.update(epochs=1, batch_size=32)
    c.sampling.method = method
    if method == "poisson":
        c.sampling.rate = rate
    c.privacy.update(delta=DELTA, accountant=accountant)
    return c


@pytest.fixture
def toy_algorithm():
    """Registers ``toy_laplace`` (FedAvg with chain(L1 clip, the noise, fixed denominator)); yields
    a setter for the noise transform it uses."""
    noise = {"transform": ToyLaplace()}

    def build(ctx):
        algorithm = FedAvg(ctx.model.per_example_loss, ctx.client_optimizer())
        return algorithm, chain(
            L1Clip(), noise["transform"], fixed_denominator(ctx.expected_cohort())
        )

    registry.register("toy_laplace", build=build, summary="a test-only Laplace mechanism")
    yield lambda transform: noise.update(transform=transform)
    registry.unregister("toy_laplace")


def _privacy(tmp_path, cfg) -> dict:
    run_experiment(cfg, str(tmp_path / "run"), progress=False)
    return json.load(open(tmp_path / "run" / "privacy.json"))


def test_a_laplace_mechanism_is_accounted_as_laplace_by_pld(tmp_path, toy_algorithm):
    """Three Poisson(0.3)-sampled Laplace(5) rounds at delta 1e-6: dp_accounting's PLD figure
    (0.193; the same rounds of a Gaussian of multiplier 5 would report 0.544)."""
    privacy = _privacy(tmp_path, _config("toy_laplace"))
    direct = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    sampled = dp_accounting.PoissonSampledDpEvent(0.3, dp_accounting.LaplaceDpEvent(5.0))
    direct.compose(sampled, 3)
    assert privacy["epsilon"] == pytest.approx(direct.get_epsilon(DELTA), rel=1e-9)
    assert privacy["epsilon"] == pytest.approx(0.193, abs=1e-3)
    assert privacy["releases"][0]["event"] == "LaplaceDpEvent(noise_multiplier=5.0)"
    assert "rdp" not in privacy["epsilons"] and privacy["formal"] is True
    assert privacy["noise_multipliers"] == []  # no Gaussian ran


def test_an_unsampled_laplace_mechanism_is_accounted_by_rdp_too(tmp_path, toy_algorithm):
    """Every client every round (q = 1): RDP composes the Laplace events as dp_accounting does."""
    privacy = _privacy(tmp_path, _config("toy_laplace", rate=1.0, accountant="rdp"))
    direct = rdp_privacy_accountant.RdpAccountant()
    direct.compose(dp_accounting.LaplaceDpEvent(5.0), 3)
    assert privacy["epsilon"] == pytest.approx(direct.get_epsilon(DELTA), rel=1e-9)
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.LaplaceDpEvent(5.0), 3)
    assert privacy["epsilons"]["pld"] == pytest.approx(pld.get_epsilon(DELTA), rel=1e-9)


def _refusal_before_data(tmp_path, cfg) -> str:
    """The error of a run whose data would fail to load (an empty MNIST folder): a privacy refusal
    raised first proves it came before the data."""
    cfg.data.update(source="mnist", data_dir=str(tmp_path / "no_data_here"))
    with pytest.raises(UnsupportedEventError) as refused:
        run_experiment(cfg, str(tmp_path / "run"), progress=False)
    return str(refused.value)


def test_a_sampled_laplace_under_rdp_is_refused_before_data_loads_naming_what_could(
    tmp_path, toy_algorithm
):
    message = _refusal_before_data(tmp_path, _config("toy_laplace", accountant="rdp"))
    assert "'toy Laplace'" in message and "privacy.accountant='rdp' cannot compose" in message
    assert "privacy.accountant='pld' can" in message


@attr.define(frozen=True)
class ToyUnknownDpEvent(dp_accounting.DpEvent):
    """An event no accountant knows."""

    scale: float


def test_an_event_no_accountant_composes_is_refused_before_data_loads(tmp_path, toy_algorithm):
    toy_algorithm(ToyLaplace(event=ToyUnknownDpEvent(2.0), name="toy mystery mechanism"))
    message = _refusal_before_data(tmp_path, _config("toy_laplace"))
    assert "'toy mystery mechanism'" in message and "ToyUnknownDpEvent" in message
    assert "no accountant here composes it" in message


@attr.define(frozen=True)
class ToyGaussianDpEvent(dp_accounting.DpEvent):
    """A project-defined event: a Gaussian of multiplier ``sigma``, registered with its RDP and
    PLD (unsampled and Poisson-sampled) from this file."""

    sigma: float


def _rdp(event, orders):
    return np.asarray(orders) / (2 * event.sigma**2)


def _poisson_rdp(event, q, orders):
    accountant = rdp_privacy_accountant.RdpAccountant(list(orders))
    accountant.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(event.sigma))
    )
    return accountant._rdp


def _poisson_pld(event, q, step):
    return privacy_loss_distribution.from_gaussian_mechanism(
        event.sigma, value_discretization_interval=step, sampling_prob=q
    )


@pytest.fixture
def toy_event():
    register_event(ToyGaussianDpEvent, rdp=_rdp, poisson_rdp=_poisson_rdp, poisson_pld=_poisson_pld)
    yield
    events.unregister_event(ToyGaussianDpEvent)


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_a_registered_project_event_is_composed_as_its_registration_says(
    tmp_path, toy_algorithm, toy_event, kind
):
    """A Gaussian declared through a project event: the same epsilon as dp_accounting's own
    Gaussian for the same sampled rounds."""
    toy_algorithm(ToyLaplace(event=ToyGaussianDpEvent(1.3), name="toy registered Gaussian"))
    privacy = _privacy(tmp_path, _config("toy_laplace", accountant=kind))
    gaussian = Accountant(kind).compose(RoundEvent("poisson", 1.3, sampling_rate=0.3), 3)
    assert privacy["epsilon"] == pytest.approx(gaussian.epsilon(DELTA), rel=1e-9)


@dataclasses.dataclass(frozen=True)
class Everyone:
    """A test's own sampler: every eligible client in every round, no amplification: its round
    event is the mechanism's itself."""

    num_clients: int
    relation: ClassVar[str] = "add/remove-one"

    def sample(self, rng, eligible=None, t=1):
        everyone = np.ones(self.num_clients, bool) if eligible is None else np.asarray(eligible)
        return np.flatnonzero(everyone)

    def expected_cohort(self, t=None):
        return float(self.num_clients)

    def denominators(self):
        return ()

    def slots(self, drawn=0):
        return None

    def capacity(self):
        return self.num_clients

    def sized_by(self):
        return f"data.num_clients={self.num_clients}"

    def can_draw(self, eligible):
        return True

    def rate_at(self, t):
        return 1.0

    def round_event(self, mechanism, t=None, eligible=None):
        if isinstance(mechanism, (int, float)):
            return RoundEvent("full", mechanism)
        return RoundEvent("full", mechanism=mechanism)

    def describe(self):
        return "everyone, every round (a test's sampler)"

    def accounting_notes(self):
        return ()


@pytest.fixture
def everyone():
    register_sampler("everyone", build=lambda section, n: Everyone(n), summary="all clients")
    yield
    unregister_sampler("everyone")


def test_a_sampler_registered_from_a_test_runs_and_is_accounted_by_its_own_event(
    tmp_path, everyone
):
    c = _config("dp_fedavg", method="everyone", accountant="rdp")
    c.dp.noise_multiplier = 4.0
    privacy = _privacy(tmp_path, c)
    direct = rdp_privacy_accountant.RdpAccountant()
    direct.compose(dp_accounting.GaussianDpEvent(4.0), 3)
    assert privacy["epsilon"] == pytest.approx(direct.get_epsilon(DELTA), rel=1e-9)
    assert privacy["sampling"] == "everyone, every round (a test's sampler)"
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["cohort_size"] for r in rows if "cohort_size" in r] == [10, 10, 10]


def test_the_gaussian_fast_path_equals_the_generic_composition():
    """Two Gaussian releases on one cohort: one Gaussian of z_eff (the fast path) against their
    composition (dp_accounting composes a composition inside a Poisson-sampled event under RDP,
    and an unsampled one under PLD)."""
    parts = [dp_accounting.GaussianDpEvent(1.2), dp_accounting.GaussianDpEvent(2.0)]
    fast, generic = round_mechanism(parts), round_mechanism(parts, fast=False)
    assert isinstance(fast, dp_accounting.GaussianDpEvent)
    assert isinstance(generic, dp_accounting.ComposedDpEvent)
    for sampling, rate, kind in (("poisson", 0.3, "rdp"), ("full", 1.0, "pld")):
        a, b = (
            Accountant(kind).compose(RoundEvent(sampling, sampling_rate=rate, mechanism=m), 20)
            for m in (fast, generic)
        )
        assert a.epsilon(1e-5) == pytest.approx(b.epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize("name, bands", [("tree", 0), ("banded", 6), ("blt", 0)])
def test_a_noise_plan_the_config_would_refuse_is_refused_through_the_python_api(name, bands):
    """Cyclic Poisson participation with b = 3: amplification holds for at most 3 bands only; a tree
    (or 6 bands) would be reported with amplified BandMF's epsilon it does not have."""
    from fedjax_dp.privacy import NoisePlan, Participation, noise_strategies
    from fedjax_dp.privacy.correlated.participation import sensitivity

    participation = Participation("cyclic_poisson", 3, rate=0.5)
    strategy = noise_strategies.build(name, 12, participation, bands)
    rule = "amplification by sampling" if name != "banded" else "would share a band"
    with pytest.raises(ValueError, match=rule):
        NoisePlan(strategy, participation, 1.0)
    with pytest.raises(ValueError, match="needs a lower-triangular C of at most 3 bands"):
        sensitivity(strategy.matrix(), participation)
    banded = noise_strategies.build("banded", 12, participation, 3)
    assert NoisePlan(banded, participation, 1.0).sensitivity == pytest.approx(1.0)
