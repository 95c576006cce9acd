"""Every registered DP algorithm's chain adds the noise its release declares and enforces the bound
its noise is calibrated to (``privacy.audit.release_check``; issue 74, item 6: the canary audit
missed a halved central noise), and the DP-SGD step adds N(0, (z C)^2) to a clipped sum within C per
example."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms import registry
from fedjax_dp.core import rng as rng_lib
from fedjax_dp.core.client_states import ClientStateStore
from fedjax_dp.core.round import FederatedRound
from fedjax_dp.core.uploads import chain
from fedjax_dp.data.builders import build_dataset
from fedjax_dp.privacy.mechanisms import gaussian as mechanisms
from fedjax_dp.privacy.audit.release_check import check_upload_noise
from fedjax_dp.privacy.mechanisms.step_dp import ClippedNoisyGradient
from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip
from fedjax_dp.privacy.distributed.plan import DistributedPlan
from fedjax_dp.privacy.distributed.transform import DistributedNoise
from fedjax_dp.privacy.mechanisms.upload_correlated_noise import CorrelatedNoise
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
from fedjax_dp.training.build import build_model_and_round
from fedjax_dp.training.cohorts import make_packer
from fedjax_dp.training.default_config import default_config


def _config(algorithm, **overrides):
    c = default_config()
    c.algorithm, c.rounds, c.seed = algorithm, 3, 0
    c.model.name = "logistic"
    c.data.update(num_clients=10, test_fraction=0.25)
    c.client.update(batch_size=8, epochs=1)
    c.sampling.cohort_size = 5
    c.engine.update(strategy="vmap", unroll="1")
    for path, value in overrides.items():
        section, _, key = path.rpartition(".")
        (c[section] if section else c)[key] = value
    return c


CASES = {  # every registered algorithm whose chain releases noise, in its modes
    "dp_fedavg central": _config("dp_fedavg", **{"dp.noise_multiplier": 1.3, "dp.clip_norm": 0.5}),
    "dp_fedavg local per-layer": _config(
        "dp_fedavg",
        **{"dp.noise_multiplier": 1.3, "dp.noise_mode": "local", "dp.clip": "per_layer"},
    ),
    "dp_fedavg central adaptive": _config(
        "dp_fedavg", **{"dp.noise_multiplier": 1.3, "dp.clip": "adaptive"}
    ),
    "dp_fedavg local per-layer adaptive": _config(
        "dp_fedavg",
        **{"dp.noise_multiplier": 1.3, "dp.noise_mode": "local", "dp.clip": "per_layer_adaptive"},
    ),
    "dp_uga": _config("dp_uga", **{"dp.noise_multiplier": 0.9}),
    "cuag_pfl sound": _config(
        "cuag_pfl",
        **{
            "cuag.mode": "sound",
            "cuag.participations": 2,
            "compression.enabled": True,
            "pfldyn.local_steps": 2,
        },
    ),
    "udp sound": _config("udp", **{"udp.mode": "sound", "udp.participations": 2}),
    "prifedsync": _config("prifedsync", **{"pfldyn.local_steps": 2}),
    "udp paper": _config("udp"),  # formal: false, so listed as unchecked
    "dp_fedavg distributed": _config(
        "dp_fedavg",
        **{
            "dp.noise_multiplier": 1.3,
            "dp.noise_mode": "distributed",
            "ddp.bits": 18,
            "sampling.method": "poisson",
            "sampling.rate": 0.5,
            "privacy.accountant": "rdp",
        },
    ),
    "dp_fedavg correlated blt": _config(
        "dp_fedavg",
        **{
            "dp.noise_multiplier": 1.3,
            "dp.noise": "blt",
            "sampling.method": "min_separation",
            "sampling.min_separation": 2,
        },
    ),
}
# their noise is in the local steps: the DP-SGD test below
STEP_DP = {"ldp_minibatch", "dp_scaffold"}


def _round_and_cohort(cfg):
    dataset = build_dataset(cfg.data, cfg.seed)
    _, model, runner = build_model_and_round(cfg, dataset)
    state = runner.init(model.init(jax.random.key(0)), jax.random.key(1))
    ids = np.arange(cfg.sampling.cohort_size)
    cohort = make_packer(cfg, dataset, runner.algorithm.requirements)(
        ids, np.random.default_rng(0), len(ids)
    )
    cohort["client_id"] = ids.astype(np.int32)
    states = None
    if runner.algorithm.requirements.client_state:
        states = ClientStateStore(runner.algorithm.client_state_init(state.params)).gather(ids)
    return runner, state, cohort, states


@pytest.mark.filterwarnings("ignore:.*NO formal")
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_dp_chain_adds_the_noise_it_declares_and_holds_its_bound(name):
    runner, state, cohort, states = _round_and_cohort(CASES[name])
    check = check_upload_noise(
        runner, state, cohort, rng_lib.round_key(jax.random.key(5), 1), states
    )
    if name == "udp paper":
        assert not check.checked  # the paper's own figure, not a multiplier of a bound
        return
    assert check.checked and check.entries >= 100
    assert check.passed, check
    # the huge uploads were clipped to (near) the bound, not zeroed
    assert check.max_norm_over_bound > 0.5


def test_the_cases_cover_every_registered_dp_algorithm():
    """A DP algorithm registered later must be added to CASES (or to STEP_DP): its default chain
    releases noise."""
    dp = set()
    for name in registry.names():
        cfg = _config(name, **({"compression.enabled": True} if name == "cuag_pfl" else {}))
        if name == "ldp_minibatch":
            cfg.server_data.overlap = 0.0
        dataset = build_dataset(cfg.data, cfg.seed)
        _, _, runner = build_model_and_round(cfg, dataset)
        if runner.uploads.releases_anything or runner.algorithm.requirements.step_noise:
            dp.add(name)
    assert dp == {case.split()[0] for case in CASES} | STEP_DP


@dataclasses.dataclass(frozen=True)
class HalvedServerNoise(GaussianNoise):
    """The issue's defect: the server adds half the noise its release declares."""

    def server(self, total, ctx):
        total = mechanisms.add_gaussian_noise(
            total,
            0.5 * ctx.inputs["z_update"] * ctx.bound,
            rng_lib.purpose_key(ctx.noise_key, rng_lib.Purpose.SERVER_NOISE),
        )
        return total, ctx.state, {}


@dataclasses.dataclass(frozen=True, eq=False)
class HalvedStream(CorrelatedNoise):
    """A correlated stream that adds half the noise its plan declares."""

    def server(self, total, ctx):
        noised, state, metrics = super().server(total, ctx)
        half = jax.tree_util.tree_map(lambda n, t: t + 0.5 * (n - t), noised, total)
        return half, state, metrics


@dataclasses.dataclass(frozen=True)
class HalfSharePlan(DistributedPlan):
    """The plan with each client's discrete Gaussian share at half its std."""

    def share_parameter(self) -> float:
        return super().share_parameter() / 2


@dataclasses.dataclass(frozen=True, eq=False)
class HalvedShares(DistributedNoise):
    """Distributed noise whose clients add shares of half the declared std."""

    def client(self, upload, ctx):
        plan = HalfSharePlan(
            **{f.name: getattr(self.plan, f.name) for f in dataclasses.fields(self.plan)}
        )
        return DistributedNoise(plan, self.template, self.dropout).client(upload, ctx)


@dataclasses.dataclass(frozen=True)
class LooseClip(FlatClip):
    """Declares the bound S but lets every upload through unclipped."""

    def client(self, upload, ctx):
        flow = super().client(upload, ctx)
        return flow._replace(upload=upload)


@pytest.mark.parametrize("defect", ["halved noise", "no clip"])
def test_the_check_catches_halved_noise_and_an_unenforced_bound(defect):
    runner, state, cohort, _ = _round_and_cohort(CASES["dp_fedavg central"])
    uploads = list(runner.uploads)
    for i, t in enumerate(uploads):
        if defect == "halved noise" and isinstance(t, GaussianNoise):
            uploads[i] = HalvedServerNoise(t.schedule)
        if defect == "no clip" and isinstance(t, FlatClip):
            uploads[i] = LooseClip(t.clip_norm)
    broken = FederatedRound(runner.algorithm, chain(*uploads), "vmap")
    check = check_upload_noise(broken, broken.init(state.params), cohort, jax.random.key(3))
    assert not check.passed
    if defect == "halved noise":
        assert (
            check.measured_std == pytest.approx(0.5 * check.declared_std, rel=0.05)
            and check.chi2_z < -20
        )
    else:
        assert check.max_norm_over_bound > 10


@pytest.mark.parametrize("per_example", [True, False])
def test_the_dp_sgd_step_adds_z_c_noise_to_a_clipped_sum(per_example):
    """Zero gradients: the step returns the noise alone, N(0, (z C)^2) per entry before the division
    by B (chi-square over 20,000 entries); huge gradients: each example contributes at most C (the
    batch mean at most C)."""
    z, clip, batch_size = 1.7, 0.3, 4
    params = {"w": jnp.zeros((20_000,))}
    batch = {"x": jnp.ones((batch_size, 1)), "scale": jnp.zeros((batch_size,))}
    mask = jnp.ones(batch_size, bool)

    def loss(p, b, key=None):
        return b["scale"] * jnp.sum(p["w"])  # gradient scale * ones per example

    hook = ClippedNoisyGradient(clip, z, per_example=per_example)
    _, noised = hook(loss, params, batch, mask, jax.random.key(0))
    noise = np.asarray(noised["w"]) * (batch_size if per_example else 1)
    chi2 = np.sum(np.square(noise)) / (z * clip) ** 2
    assert abs((chi2 - noise.size) / np.sqrt(2 * noise.size)) < 5
    quiet = ClippedNoisyGradient(clip, 0.0, per_example=per_example)
    _, clipped = quiet(
        loss, params, {**batch, "scale": jnp.full((batch_size,), 1e3)}, mask, jax.random.key(0)
    )
    total = float(jnp.linalg.norm(clipped["w"])) * (batch_size if per_example else 1)
    assert total == pytest.approx(clip * (batch_size if per_example else 1), rel=1e-5)


def test_a_correlated_stream_is_checked_round_by_round_against_its_own_std():
    """Three rounds of BLT noise from the stream's first state: each round's noise against z
    sens(C) S ||C^-1[t]||; the same stream at half its std is caught."""
    runner, state, cohort, _ = _round_and_cohort(CASES["dp_fedavg correlated blt"])
    check = check_upload_noise(runner, state, cohort, jax.random.key(4), round_index=3)
    assert check.checked and check.passed, check
    uploads = list(runner.uploads)
    for i, t in enumerate(uploads):
        if isinstance(t, CorrelatedNoise):
            uploads[i] = HalvedStream(t.plan)
    broken = FederatedRound(runner.algorithm, chain(*uploads), "vmap")
    check = check_upload_noise(
        broken, broken.init(state.params), cohort, jax.random.key(4), round_index=3
    )
    assert not check.passed and check.chi2_z < -20


def test_distributed_noise_is_checked_against_the_surviving_shares():
    runner, state, cohort, _ = _round_and_cohort(CASES["dp_fedavg distributed"])
    assert check_upload_noise(runner, state, cohort, jax.random.key(5)).passed
    uploads = list(runner.uploads)
    for i, t in enumerate(uploads):
        if isinstance(t, DistributedNoise):
            uploads[i] = HalvedShares(t.plan, t.template, t.dropout)
    broken = FederatedRound(runner.algorithm, chain(*uploads), "vmap")
    check = check_upload_noise(broken, broken.init(state.params), cohort, jax.random.key(5))
    assert not check.passed and check.chi2_z < -20
