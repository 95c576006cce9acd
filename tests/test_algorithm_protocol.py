"""The algorithm protocol, the registry and upload chains: a toy algorithm registered from this file
alone runs through the experiment loop with DP and compression chained; chains that make no sense
for privacy are refused; an unknown name or key is refused before any data is loaded."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms import registry
from fedjax_dp.compression.upload_transform import CompressedSensing
from fedjax_dp.core import tree
from fedjax_dp.core.algorithm import ClientOut, Requirements, apply_mean_upload, init_server_state
from fedjax_dp.core.local_training import masked_mean
from fedjax_dp.core.optimizers import build_optimizer
from fedjax_dp.core.uploads import UniformWeights, chain, fixed_denominator
from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip, MedianClip
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment


@dataclasses.dataclass(frozen=True)
class OneGradientStep:
    """FedSGD: each client uploads -lr * (its mean-loss gradient at w_t over its first batch)."""

    per_example_loss: object
    learning_rate: float
    requirements = Requirements()

    def init(self, params, key=None):
        return init_server_state(params, build_optimizer("sgd", 1.0))

    def upload_template(self, params):
        return params

    def broadcast(self, state):
        return state.params

    def client_update(self, params, client, client_state, key):
        batch = jax.tree_util.tree_map(lambda a: a[0], client["batches"])
        loss, grad = jax.value_and_grad(
            lambda p: masked_mean(self.per_example_loss(p, batch, key), client["mask"][0])
        )(params)
        upload = jax.tree_util.tree_map(lambda g: -self.learning_rate * g, grad)
        return ClientOut(
            upload, jnp.float32(1.0), None, loss, tree.is_finite(upload) & jnp.isfinite(loss)
        )

    def server_update(self, state, aggregate, key):
        return (
            apply_mean_upload(
                state, aggregate.mean, aggregate.applies, build_optimizer("sgd", 1.0)
            ),
            {},
        )


@pytest.fixture
def toy_algorithm():
    def build(ctx):
        uploads = chain(
            FlatClip(0.5), GaussianNoise(((1, 1.5),)), fixed_denominator(ctx.expected_cohort())
        )
        return OneGradientStep(ctx.model.per_example_loss, 0.5), uploads

    registry.register("toy_one_step", build=build, summary="test-only FedSGD with a DP chain")
    yield "toy_one_step"
    registry.unregister("toy_one_step")


def _config(algorithm):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = algorithm, 3, 3
    c.data.num_clients = 12
    c.model.name = "logistic"
    c.client.update(epochs=1, batch_size=32)
    c.sampling.cohort_size = 4
    c.engine.update(strategy="vmap", unroll="1")
    return c


def test_a_toy_algorithm_registered_here_runs_in_the_loop_with_dp_and_compression(
    toy_algorithm, tmp_path
):
    c = _config(toy_algorithm)
    c.compression.update(enabled=True, rates="0.5")
    summary = run_experiment(c, str(tmp_path / "run"), progress=False)
    # [0]: the initial model
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")][1:]
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    assert summary.rounds == 3 and np.isfinite(summary.final["test_loss"])
    assert (
        privacy["formal"]
        and privacy["epsilon"] == pytest.approx(summary.epsilon)
        and privacy["rounds"] == 3
    )
    # from the chain's declared release, not from cfg.dp
    assert privacy["noise_multipliers"] == [1.5]
    assert all(r["compression_rates"] == [0.5, 0.5] for r in rows)
    dense = 4 * (784 * 10 + 10)
    assert rows[0]["uplink_bytes"] < 4 * dense * 0.6  # 4 clients, half the measurements each
    assert "Gaussian noise" in privacy["mechanism"]


def test_compression_is_placed_before_the_clip_when_composed_with_dp(toy_algorithm):
    from fedjax_dp.compression.config import with_compression

    c = default_config().compression
    composed = with_compression(chain(FlatClip(1.0), GaussianNoise(), fixed_denominator(4)), c)
    assert [type(t).__name__ for t in composed] == [
        "CompressedSensing",
        "FlatClip",
        "GaussianNoise",
        "UniformWeights",
    ]
    assert composed[0].reconstruct == "aggregate"  # the server reconstructs the noised sum it sees
    plain = with_compression(chain(), c)
    assert plain[0].reconstruct == "each"


def test_scaffold_compresses_both_of_its_uploads(tmp_path):
    c = _config("scaffold")
    c.compression.update(enabled=True, rates="0.5")
    run_experiment(c, str(tmp_path / "s"), progress=False)
    # [0]: the initial model
    rows = [json.loads(line) for line in open(tmp_path / "s" / "metrics.jsonl")][1:]
    assert len(rows[0]["compression_rates"]) == 4  # model and control deltas, weights and bias each
    assert rows[0]["uplink_bytes"] < 4 * 2 * 4 * (7850) * 0.6


@pytest.mark.parametrize(
    "transforms, message",
    [
        ((GaussianNoise(), FlatClip(1.0), fixed_denominator(4)), "noise before any clip"),
        (
            (FlatClip(1.0), GaussianNoise(), GaussianNoise(local=True), fixed_denominator(4)),
            "2 noise transforms",
        ),
        ((FlatClip(1.0), GaussianNoise()), "need uniform weights"),
        (
            (FlatClip(1.0), GaussianNoise(), UniformWeights()),
            "central noise needs a fixed denominator",
        ),
        ((MedianClip(), GaussianNoise(local=True), fixed_denominator(4)), "cannot be local"),
        (
            (
                FlatClip(1.0),
                CompressedSensing(reconstruct="aggregate"),
                GaussianNoise(),
                fixed_denominator(4),
            ),
            "compression between the clip and the noise",
        ),
        ((FlatClip(1.0), "gaussian"), "takes upload transforms, got str"),
    ],
)
def test_chains_that_make_no_sense_are_refused(transforms, message):
    with pytest.raises((ValueError, TypeError), match=message):
        chain(*transforms)


def _refused(c, tmp_path):
    with pytest.raises(ValueError) as error:
        run_experiment(c, str(tmp_path / "never"), progress=False)
    assert not os.path.exists(tmp_path / "never")  # refused before any data is loaded or written
    return str(error.value)


def test_unknown_algorithm_foreign_section_and_unknown_key_are_refused_before_loading(tmp_path):
    c = _config("fedavgg")
    c.data.source = "/no/such/dataset"
    assert "algorithm 'fedavgg' unknown; available: (" in _refused(c, tmp_path)
    c = _config("fedavg")
    c.dp.noise_multiplier = 2.0
    assert (
        "dp.noise_multiplier=2.0 is set, but algorithm 'fedavg' does not read section 'dp'"
        in _refused(c, tmp_path)
    )
    c = _config("fedavg")
    # configs are locked (issue 19)
    with pytest.raises(AttributeError, match='Did you mean "learning_rate"'):
        c.client.learnig_rate = 0.1
    c.unlock()  # a config someone unlocked (or built without default_config) is still checked
    c.client.learnig_rate = 0.1
    assert (
        "unknown config key 'client.learnig_rate' (= 0.1); did you mean 'client.learning_rate'?"
        in _refused(c, tmp_path)
    )


@pytest.mark.parametrize("mode", ["paper", "sound"])
def test_cuag_adaptive_gdp_noise_runs_in_the_loop_and_is_labelled(mode, tmp_path):
    """Issue 15 item 3: CUAG-PFL's Alg. 4 noise is reachable from a run. Paper mode (as written):
    ``formal: false`` and the epsilon is the paper's CLT figure (lambda = 1) composed over each
    client's rounds; sound mode (fixed C_l + local Gaussian): formal, z from the chain."""
    from fedjax_dp.algorithms.fedavg import FedAvg
    from fedjax_dp.privacy.accounting import gdp
    from fedjax_dp.privacy.mechanisms import adaptive_gdp
    from fedjax_dp.privacy.mechanisms.upload_cuag_noise import CuagPaperNoise, cuag_sound_noise

    setting = dict(sampling_rate=1 / 3, batch_size=32, dataset_size=400, local_steps=2)

    def build(ctx):
        algorithm = FedAvg(
            ctx.model.per_example_loss,
            ctx.client_optimizer(),
            server_optimizer=ctx.server_optimizer(),
        )
        noise = (
            (CuagPaperNoise(mu=0.5, **setting),)
            if mode == "paper"
            else cuag_sound_noise((0.3, 0.1), ((1, 2.0),))
        )
        return algorithm, chain(*noise, UniformWeights())

    registry.register("toy_cuag_noise", build=build, summary="test-only FedAvg + CUAG noise")
    try:
        summary = run_experiment(_config("toy_cuag_noise"), str(tmp_path / "run"), progress=False)
    finally:
        registry.unregister("toy_cuag_noise")
    privacy = json.load(open(tmp_path / "run" / "privacy.json"))
    assert summary.rounds == 3 and np.isfinite(summary.final["test_loss"])
    if mode == "sound":
        assert (
            privacy["formal"]
            and privacy["noise_mode"] == "local"
            and privacy["noise_multipliers"] == [2.0]
        )
        return
    assert privacy["formal"] is False and "NO formal" in " ".join(privacy["notes"])
    # the headline: the paper's formula over the 3 rounds run, lambda included (issue 74, item 3; a
    # release claim)
    assert privacy["epsilon"] == pytest.approx(
        gdp.epsilon_from_mu(adaptive_gdp.schedule_mu(3, 0.5, **setting), privacy["delta"]), rel=1e-9
    )
    taking_part = dict(setting, sampling_rate=1.0)  # per client: the paper's figure without lambda
    mu_t = [
        adaptive_gdp.formula_mu(adaptive_gdp.noise_scale(t, 0.5, **setting), 1, **taking_part)
        for t in (1, 2, 3)
    ]
    possible = {
        gdp.epsilon_from_mu(
            float(np.sqrt(sum(m * m for m, used in zip(mu_t, rounds) if used))), privacy["delta"]
        )
        for rounds in [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]
        if any(rounds)
    }
    # rounds it ran
    assert min(abs(privacy["epsilons"]["per_client_gdp_exact_max"] - e) for e in possible) < 1e-9


def test_an_algorithm_with_personalize_gets_personalized_accuracy(tmp_path):
    """Issue 15 item 1 / issue 17 item 2: the optional ``personalized_correct``: evaluation reports
    the mean per-client accuracy of each client's own model (here: the global model, or a model that
    predicts class 0 everywhere), computed in one mapped pass over every client."""
    from fedjax_dp.algorithms.fedavg import FedAvg

    @dataclasses.dataclass(frozen=True)
    class Personalized(FedAvg):
        requirements = Requirements(personalized=True)
        zero: bool = False
        apply: object = None

        def personalized_correct(self, state, client_state, train, test):
            assert train["x"].shape[0] == train["y"].shape[0] == train["mask"].shape[0] > 0
            params = state.params
            if self.zero:  # all-zero weights and biases: every logit ties, argmax picks class 0
                params = jax.tree_util.tree_map(jnp.zeros_like, params)
            return (jnp.argmax(self.apply(params, test["x"]), -1) == test["y"]).astype(jnp.float32)

    results = {}
    for zero in (False, True):

        def build(ctx, zero=zero):
            return (
                Personalized(
                    ctx.model.per_example_loss,
                    ctx.client_optimizer(),
                    server_optimizer=ctx.server_optimizer(),
                    zero=zero,
                    apply=ctx.model.apply,
                ),
                chain(),
            )

        registry.register("toy_personalized", build=build, summary="test-only personalised FedAvg")
        try:
            c = _config("toy_personalized")
            c.data.test_fraction = 0.2
            run_experiment(c, str(tmp_path / str(zero)), progress=False)
        finally:
            registry.unregister("toy_personalized")
        results[zero] = [json.loads(line) for line in open(tmp_path / str(zero) / "metrics.jsonl")][
            -1
        ]
    assert results[False]["personalized_accuracy"] == pytest.approx(
        results[False]["client_accuracy"]
    )
    assert results[True]["personalized_accuracy"] != pytest.approx(results[True]["client_accuracy"])


@pytest.mark.parametrize("limit_gb, one_device", [(0.0, True), (1.0, False)])
def test_a_run_records_whether_its_cohort_ran_on_one_device_to_save_memory(
    limit_gb, one_device, tmp_path
):
    """``engine.max_replicated_gb``: a spread that would copy more than this of the shared inputs
    runs on one device; the run's summary says so beside the configured spread (the CPU loop: the
    same numbers)."""
    if len(jax.local_devices()) < 2:
        pytest.skip("needs two devices (fedjax_dp gives JAX one CPU device per core)")
    c = _config("fedavg")
    c.rounds = c.eval_every = 1
    c.engine.update(strategy="loop", num_devices=2, max_replicated_gb=limit_gb)
    run_experiment(c, str(tmp_path / "run"), progress=False)
    engine = json.load(open(tmp_path / "run" / "summary.json"))["engine"]
    assert engine["devices"] == 2 and engine["ran_on_one_device"] is one_device


def _positional_constructions():
    """Each constructor called with one of its numeric parameters by position: every one must
    refuse."""
    import optax
    from fedjax_dp.algorithms.fedavg import FedAvg
    from fedjax_dp.algorithms.fedmeta import FedMeta
    from fedjax_dp.algorithms.pfldyn_proto import PFLDynProto
    from fedjax_dp.algorithms.scaffold import Scaffold
    from fedjax_dp.privacy.ledgers.example_book import ExampleBook
    from fedjax_dp.privacy.mechanisms.upload_clipping import AdaptiveQuantileClip
    from fedjax_dp.privacy.mechanisms.upload_cuag_noise import CuagPaperNoise
    from fedjax_dp.privacy.mechanisms.upload_layer_quantile_clip import PerLayerQuantileClip

    def loss(params, batch):
        return batch["x"].sum(-1)

    sgd = optax.sgd(0.1)
    x, y = np.zeros((4, 2), np.float32), np.zeros(4, np.int32)
    return {
        "FedAvg": lambda: FedAvg(loss, sgd, sgd, 0.99),
        "Scaffold": lambda: Scaffold(loss, sgd, 0.1, 4),
        "FedMeta": lambda: FedMeta(FedAvg(loss, sgd), loss, x, y, 0.1),
        "ExampleBook": lambda: ExampleBook(np.array([100]), 10, 5, 3.0, 1e-5, 1.0, 4.0, 0.1, 10),
        "AdaptiveQuantileClip": lambda: AdaptiveQuantileClip(1.0, 0.5, 0.2, 1.0, 10.0),
        "PerLayerQuantileClip": lambda: PerLayerQuantileClip((1.0,), 0.5, 0.2, 1.0, 10.0),
        "CuagPaperNoise": lambda: CuagPaperNoise(0.25, 0.1, 50, 500, 25),
        "PFLDynProto": lambda: PFLDynProto(loss, 10, sgd, 100, 0.1, 25),
    }


@pytest.mark.parametrize("name", sorted(_positional_constructions()))
def test_training_and_privacy_parameters_are_taken_by_name_only(name):
    """A field added to FedAvg once shifted LdpMinibatch's positional builder: its clients ran the
    wrong steps and clip while the ledger accounted the configured ones (f085950). Where a
    constructor takes several numbers of privacy or training, they are keyword-only, so no added
    field can move one into another's place."""
    with pytest.raises(TypeError, match="positional"):
        _positional_constructions()[name]()
