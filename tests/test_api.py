"""The public Python API: curated exports, ``Experiment`` validation before any data is loaded,
samplers that carry their accounting, strict JSON results, TensorBoard scalars."""

import importlib
import json
import math

import numpy as np
import pytest

import fedjax_dp
from fedjax_dp.privacy import Accountant, FixedSizeSampling, PoissonSampling
from fedjax_dp.training import results

SUBPACKAGES = ("algorithms", "compression", "core", "data", "models", "privacy", "training")


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_every_subpackage_exports_what_its_all_names(name):
    module = importlib.import_module(f"fedjax_dp.{name}")
    assert module.__all__ and all(hasattr(module, n) for n in module.__all__)
    assert set(module.__all__) <= set(dir(module))


def test_experiment_refuses_a_typo_naming_the_closest_key_before_loading(monkeypatch):
    import fedjax_dp.training.run_context as run_context

    monkeypatch.setattr(run_context, "build_dataset", lambda *a: pytest.fail("data was loaded"))
    with pytest.raises(KeyError, match="did you mean 'dp.noise_multiplier'"):
        fedjax_dp.Experiment("dp_fedavg_mnist", {"dp.noise_multipler": 2.0})
    with pytest.raises(ValueError, match="sampling.rate q must lie in"):
        fedjax_dp.Experiment("dp_fedavg_mnist", {"sampling.rate": 1.5})
    cfg = fedjax_dp.default_config()
    with pytest.raises(AttributeError, match='Did you mean "noise_multiplier"'):
        cfg.dp.noise_multipler = 2.0


def test_an_override_that_the_chosen_value_of_another_key_does_not_read_is_refused(monkeypatch):
    """Bug (found 2026-11-29 by a new-user trial): ``sampling.cohort_size=50`` under Poisson
    sampling (``dp_fedavg_mnist``), ``sampling.rate=0.5`` under uniform sampling, ``data.alpha``
    without the Dirichlet partition, ``compression.rates`` with compression off and
    ``client.epochs`` for CUAG-PFL (P sampled steps) all ran without a word and without effect. Now
    each override is refused, before any data is loaded, naming the key and what would read it."""
    import fedjax_dp.training.run_context as run_context

    monkeypatch.setattr(run_context, "build_dataset", lambda *a: pytest.fail("data was loaded"))
    for name, overrides, message in (
        (
            "dp_fedavg_mnist",
            {"sampling.cohort_size": 50},
            (
                "sampling.cohort_size=50 is not read while sampling.method='poisson' (only with"
                " sampling.method 'uniform' or 'min_separation' or 'single')"
            ),
        ),
        (
            "fedavg_mnist",
            {"sampling.rate": 0.5},
            "sampling.rate=0.5 is not read while sampling.method='uniform'",
        ),
        (
            "fedavg_mnist",
            {"data.alpha": 0.1},
            "data.alpha=0.1 is not read while data.partition='shards'",
        ),
        (
            "fedavg_mnist",
            {"data.invert": True},
            "data.invert=True is not read while data.source='mnist_5k'",
        ),
        (
            "fedavg_mnist",
            {"client.optimizer": "adam", "client.momentum": 0.9},
            "client.momentum=0.9 is not read while client.optimizer='adam'",
        ),
        (
            "fedavg_mnist",
            {"compression.rates": "0.3"},
            (
                "compression.rates='0.3' is not read while compression.enabled=False: set"
                " compression.enabled=True"
            ),
        ),
        (
            "cuag_pfl_cifar10",
            {"cuag.clip_norm": 2.0},
            "cuag.clip_norm=2.0 is not read while cuag.mode='paper'",
        ),
        (
            "cuag_pfl_cifar10",
            {"client.epochs": 5},
            (
                "client.epochs=5 is not read by algorithm 'cuag_pfl': its clients run a fixed"
                " number of sampled steps"
            ),
        ),
        (
            "ldp_minibatch_mnist",
            {"server.learning_rate": 0.5},
            (
                "server.learning_rate=0.5 is not read by algorithm 'ldp_minibatch': its server step"
                " is its own"
            ),
        ),
    ):
        with pytest.raises(ValueError) as error:
            fedjax_dp.Experiment(name, overrides)
        assert message in str(error.value)
    fedjax_dp.Experiment("fedavg_mnist", {"sampling.rate": 0.5, "sampling.method": "poisson"})
    fedjax_dp.Experiment("cuag_pfl_cifar10", {"cuag.clip_norm": 2.0, "cuag.mode": "sound"})
    # a shipped config may hold values for an option it leaves off (FedMeta's, in uga_fedmeta_*):
    # not an override
    fedjax_dp.Experiment(
        "uga_fedmeta_cifar10", {"sampling.method": "poisson", "sampling.rate": 0.2}
    )


def test_an_override_of_the_wrong_type_names_the_key_and_a_number_for_a_text_key_is_taken():
    with pytest.raises(
        ValueError, match=r"config key 'rounds' expects int \(default 40\), got 'many'"
    ):
        fedjax_dp.Experiment("dp_fedavg_mnist", {"rounds": "many"})
    assert fedjax_dp.configs.get("ldp_minibatch_mnist", {"ldp.thresholds": 4}).ldp.thresholds == "4"
    assert fedjax_dp.configs.get("cuag_pfl_cifar10", {"cuag.sigma": 0.45}).cuag.sigma == "0.45"


def test_the_sampler_names_its_own_accounting_event():
    """Uniform sampling accounted as Poisson under-reported epsilon (1.66 for 8): a sampler's own
    event cannot be mismatched. Exact-m sampling costs more for the same rate and noise."""
    poisson, fixed = PoissonSampling(1000, 0.1), FixedSizeSampling(1000, 100)
    assert (
        poisson.round_event(1.0).sampling == "poisson"
        and fixed.round_event(1.0).sampling == "fixed"
    )
    eps = {
        type(s).__name__: Accountant("rdp").compose(s.round_event(1.0), 100).epsilon(1e-5)
        for s in (poisson, fixed)
    }
    assert eps["FixedSizeSampling"] > 1.5 * eps["PoissonSampling"]
    rng = np.random.default_rng(0)
    assert (
        len(fixed.sample(rng)) == 100
        and fixed.expected_cohort() == poisson.expected_cohort() == 100
    )
    with pytest.raises(ValueError, match="rate=1.5"):
        PoissonSampling(10, 1.5)


def test_results_are_strict_json_with_non_finite_values_named():
    text = results.dumps(
        {
            "loss": float("nan"),
            "epsilon": math.inf,
            "ok": np.float32(0.5),
            "values": [1.0, float("-inf")],
            "nested": {"x": np.array([np.nan, 2.0])},
        }
    )
    parsed = json.loads(
        text, parse_constant=lambda token: pytest.fail(f"non-standard token {token}")
    )
    assert parsed["loss"] is None and parsed["loss_nonfinite"] == "nan"
    assert parsed["epsilon"] is None and parsed["epsilon_nonfinite"] == "inf"
    assert (
        parsed["ok"] == 0.5
        and parsed["values"] == [1.0, None]
        and parsed["nested"]["x"] == [None, 2.0]
    )


def test_write_json_creates_its_folder_and_writes_strict_json(tmp_path):
    path = tmp_path / "new" / "deeper" / "report.json"
    results.write_json(str(path), {"accuracy": np.float32(0.25), "loss": float("nan")})
    parsed = json.loads(
        path.read_text(), parse_constant=lambda token: pytest.fail(f"non-standard token {token}")
    )
    assert parsed == {"accuracy": 0.25, "loss": None, "loss_nonfinite": "nan"}


def _tfrecord_events(path):
    """The Event protos of a TensorBoard event file (TFRecord framing: length, crc, data, crc)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    data, events, offset = open(path, "rb").read(), [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        events.append(Event.FromString(data[offset + 12 : offset + 12 + length]))
        offset += 12 + length + 4
    return events


def test_tensorboard_scalars_are_every_finite_metric_by_round(tmp_path):
    pytest.importorskip("tensorboardX")
    import glob

    summary = fedjax_dp.Experiment(
        "fedavg_mnist", {"rounds": 2, "eval_every": 1, "model.name": "logistic"}
    ).run(str(tmp_path / "tb"), progress=False, tensorboard=True)
    (event_file,) = glob.glob(str(tmp_path / "tb" / "tensorboard" / "events.out.tfevents.*"))
    scalars = {
        (v.tag, e.step): v.simple_value
        for e in _tfrecord_events(event_file)
        for v in e.summary.value
    }
    assert scalars[("test_accuracy", 2)] == pytest.approx(summary.final["test_accuracy"])
    assert (
        ("test_accuracy", 0) in scalars
        and ("train_loss", 1) in scalars
        and ("train_loss", 0) not in scalars
    )


def test_seed_bands_are_clipped_to_the_metrics_range_and_say_n():
    """Issue 74, item 22: two seeds' 95 % t-interval drew an accuracy band from -0.6 to 1.8,
    unlabelled by n."""
    from fedjax_dp.training.plots import band_label, seed_band, test_sizes_note

    low, high = seed_band("test_accuracy", [-0.6, 0.2], [1.8, 0.4])
    assert low.tolist() == [0.0, 0.2] and high.tolist() == [1.0, 0.4]
    low, high = seed_band("epsilon", [-1.0], [3.0])
    assert low.tolist() == [0.0] and high.tolist() == [3.0]
    assert (
        band_label(2) == "95 % t-interval over n = 2 seeds (n < 3: too few for a usable interval)"
    )
    assert band_label(5) == "95 % t-interval over n = 5 seeds"
    assert "12-40 test examples per client, median 20" in test_sizes_note([12, 20, 40])


def test_an_interrupted_seed_stops_the_seeds_still_to_run(tmp_path):
    """SIGTERM during seed 0 ends its run gracefully, and seed 1 is not started (before, the loop
    went on to the next seed as if nothing had been asked)."""
    import os
    import signal

    from fedjax_dp.training.callbacks import Callback

    class Terminate(Callback):
        def after_round(self, run, t, row):
            os.kill(os.getpid(), signal.SIGTERM)

    experiment = fedjax_dp.Experiment(
        "fedavg_mnist", {"rounds": 3, "eval_every": 3, "model.name": "logistic"}
    )
    summary = experiment.run_seeds(
        [0, 1], str(tmp_path / "seeds"), progress=False, callbacks=[Terminate()]
    )
    assert summary.interrupted and summary.seeds == [0]
    assert not (tmp_path / "seeds" / "seed_1").exists()
