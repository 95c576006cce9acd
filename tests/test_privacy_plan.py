"""The privacy plan (issue 73): a DP mechanism is its module and its tests. A new DP algorithm
registered from this file alone, with its own upload transform and its own typed release, gets the
privacy section (``privacy.delta`` set), the one tracker, and an epsilon that dp_accounting
reproduces from the event the release declares; moved keys are refused with their new name; the
round returns the releases of the chain that ran."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import ClassVar

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core import tree
from fedjax_dp.core.release import Release
from fedjax_dp.core.uploads import (
    ClientContext,
    Flow,
    ServerContext,
    UploadTransform,
    chain,
    fixed_denominator,
)
from fedjax_dp.privacy.mechanisms.gaussian import add_gaussian_noise
from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment


@dataclasses.dataclass(frozen=True)
class ToyNoise(UploadTransform):
    """A test's own mechanism: Gaussian noise of std z S, on the cohort's sum (central) or on each
    upload (local), with its own release. Nothing of it is known to the library."""

    kind: ClassVar[str] = "noise"
    z: float = 1.7
    local: bool = False

    def client(self, upload, ctx: ClientContext) -> Flow:
        if not self.local:
            return Flow(upload, ctx.bound)
        noised = add_gaussian_noise(upload, self.z * ctx.bound, ctx.noise_key)
        return Flow(
            tree.where(ctx.present, noised, jax.tree_util.tree_map(jnp.zeros_like, upload)),
            ctx.bound,
        )

    def server(self, total, ctx: ServerContext):
        if not self.local:
            total = add_gaussian_noise(
                total, self.z * ctx.bound, jax.random.fold_in(ctx.noise_key, 99)
            )
        return total, ctx.state, {}

    def releases(self, inputs, bound=math.nan):
        return (
            Release(
                "toy Gaussian", "local" if self.local else "central", self.z, "S", bound_value=bound
            ),
        )


def _run(tmp_path, local: bool, sampling: str):
    def build(ctx):
        algorithm = FedAvg(
            ctx.model.per_example_loss,
            ctx.client_optimizer(),
            server_optimizer=ctx.server_optimizer(),
        )
        return algorithm, chain(
            FlatClip(0.4), ToyNoise(local=local), fixed_denominator(ctx.expected_cohort())
        )

    registry.register("toy_dp", build=build, summary="a test-only DP algorithm")
    try:
        c = default_config()
        c.algorithm, c.rounds, c.eval_every, c.model.name = "toy_dp", 4, 4, "logistic"
        c.data.num_clients = 10
        c.client.update(epochs=1, batch_size=32)
        c.sampling.update(method=sampling, rate=0.3, cohort_size=3)
        c.privacy.delta = 1e-6  # the one delta, read by the one tracker
        run_experiment(c, str(tmp_path / "run"), progress=False)
    finally:
        registry.unregister("toy_dp")
    return json.load(open(tmp_path / "run" / "privacy.json"))


def test_a_central_mechanism_registered_from_a_test_is_accounted_from_its_declared_event(tmp_path):
    """Poisson sampling, 4 rounds: dp_accounting's RDP of PoissonSampledDpEvent(0.3, the declared
    event), 4 times."""
    privacy = _run(tmp_path, local=False, sampling="poisson")
    (release,) = privacy["releases"]
    assert release["event"] == "GaussianDpEvent(noise_multiplier=1.7)" and release[
        "sensitivity"
    ] == pytest.approx(0.4)
    direct = rdp_privacy_accountant.RdpAccountant()
    direct.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(0.3, dp_accounting.GaussianDpEvent(1.7)), 4
        )
    )
    assert privacy["delta"] == 1e-6 and privacy["formal"] is True
    assert privacy["epsilon"] == pytest.approx(direct.get_epsilon(1e-6), rel=1e-9)


def test_a_local_mechanism_registered_from_a_test_gets_per_client_ledgers_from_its_declared_event(
    tmp_path,
):
    """Local noise, fixed-size cohorts of 3: each client's ledger composes the declared replace-one
    event GaussianDpEvent(z / 2) over its participations; dp_accounting's PLD of that composition
    (pessimistic, fine discretisation) reproduces the busiest client's epsilon (exact GDP) to
    1e-3."""
    privacy = _run(tmp_path, local=True, sampling="uniform")
    (release,) = privacy["releases"]
    assert release["neighboring_relation"] == "replace-one" and release[
        "sensitivity"
    ] == pytest.approx(0.8)
    assert release["event"] == "GaussianDpEvent(noise_multiplier=0.85)"
    most = max(privacy["accounting"]["per_client_participations"])
    direct = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    direct.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(0.85), most))
    assert privacy["epsilon"] <= direct.get_epsilon(1e-6) <= privacy["epsilon"] + 1e-3
    assert privacy["noise_mode"] == "local" and privacy["formal"] is True


def test_the_round_returns_the_releases_of_the_chain_that_ran_with_their_bound():
    """``RoundResult.releases``: the specialised chain's, with the numeric bound of the state that
    ran (an adaptive clip's current norm, not its initial one)."""
    from fedjax_dp.core.round import FederatedRound
    from fedjax_dp.data.packing import pack_cohort
    from fedjax_dp.models import get_model
    from fedjax_dp.privacy.mechanisms.upload_clipping import AdaptiveQuantileClip
    from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise

    model = get_model("logistic", (4, 4, 1), 3)
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(24, 4, 4, 1)).astype(np.float32), rng.integers(0, 3, 24)
    cohort = pack_cohort(x, y, [np.arange(8 * k, 8 * k + 8) for k in range(3)], 4, 1, rng)
    clip = AdaptiveQuantileClip(initial_clip_norm=1e-3, count_noise_std=2.0, denominator=3.0)
    runner = FederatedRound(
        FedAvg(model.per_example_loss, optax.sgd(0.1)),
        chain(clip, GaussianNoise(((1, 1.2),), count_noise_std=2.0), fixed_denominator(3.0)),
    )
    state = runner.init(params)
    first = runner(state, cohort, jax.random.key(1))
    second = runner(first.state, cohort, jax.random.key(2))
    noise = [r for r in second.releases if r.mechanism.startswith("Gaussian")][0]
    assert [r.mechanism for r in first.releases] == [
        r.mechanism for r in runner.uploads.releases(1)
    ]
    # the clip norm round 2 ran with
    assert noise.bound_value == pytest.approx(float(first.state.uploads[0]))
    assert noise.bound_value > 1e-3  # it grew: every update was clipped


@pytest.mark.parametrize(
    "old, new",
    [
        ("dp.delta", "privacy.delta"),
        ("dp.calibrate_epsilon", "privacy.target_epsilon"),
        ("dp.target_epsilon", "privacy.stop_epsilon"),
        ("ldp.accountant", "privacy.accountant"),
        ("cuag.delta", "privacy.delta"),
    ],
)
def test_a_moved_key_is_refused_with_its_new_name(old, new):
    import fedjax_dp

    with pytest.raises(
        KeyError, match=f"config key '{old}' moved to the privacy section: it is '{new}' now"
    ):
        fedjax_dp.Experiment("dp_fedavg_mnist", {old: 1e-6})


def test_a_privacy_key_the_algorithm_does_not_read_is_refused():
    import fedjax_dp

    with pytest.raises(
        ValueError, match="privacy.delta=1e-06 is set, but algorithm 'fedavg' does not read it"
    ):
        fedjax_dp.Experiment("fedavg_mnist", {"privacy.delta": 1e-6})
    with pytest.raises(
        ValueError, match="privacy.target_epsilon=4.0 is set, but algorithm 'udp' does not read it"
    ):
        fedjax_dp.Experiment("fedavg_mnist", {"algorithm": "udp", "privacy.target_epsilon": 4.0})
