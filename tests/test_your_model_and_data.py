"""Your own model and your own federated data, from outside the package: a flax CNN and a
synthetic non-IID dataset defined here run FedAvg, DP-FedAvg under Poisson sampling and BLT
correlated noise under min-separation, through ``Experiment`` and through the command line
(``--import`` of this very file); each bad model and each bad dataset is refused in one line before
any training.

This module registers ``my_cnn`` and ``my_clients`` when imported, as a user's module would: the
command-line tests import it with ``--import test_your_model_and_data``.
"""

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_dp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPE, CLASSES, CLIENTS = (6, 6, 1), 3, 12


class TinyCNN(nn.Module):
    """conv 3x3-4, ReLU, dense 16, ReLU, dense classes; ``penultimate`` gives the dense 16."""

    num_classes: int

    @nn.compact
    def __call__(self, x, penultimate: bool = False):
        x = nn.relu(nn.Conv(4, (3, 3))(x)).reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(16)(x))
        return x if penultimate else nn.Dense(self.num_classes)(x)


def non_iid_clients(num_clients: int = CLIENTS, seed: int = 0) -> dict:
    """Client ``user-k`` holds two of the three classes (k mod 3 and the next), in its own
    proportion and number (10 to 21 examples); an example of class c is noise around c."""
    rng = np.random.default_rng(seed)
    clients = {}
    for k in range(num_clients):
        n = 10 + k
        y = np.where(rng.random(n) < rng.uniform(0.2, 0.8), k % CLASSES, (k + 1) % CLASSES)
        x = rng.normal(size=(n,) + SHAPE).astype(np.float32) + y[:, None, None, None]
        clients[f"user-{k}"] = (x, y)
    return clients


fedjax_dp.register_model("my_cnn", TinyCNN, replace=True)
fedjax_dp.register_data("my_clients", non_iid_clients(), replace=True)

TINY = {
    "rounds": 2,
    "eval_every": 2,
    "client.epochs": 1,
    "client.batch_size": 8,
    "model.name": "my_cnn",
    "data.source": "my_clients",
}
RUNS = {
    "fedavg": ("fedavg_mnist", {**TINY, "sampling.cohort_size": 4}),
    # z given rather than calibrated (a calibration to a target costs ~10 s here); the epsilon
    # is checked against the accountant's for two Poisson rounds below
    "dp_fedavg_poisson": (
        "dp_fedavg_mnist",
        {**TINY, "sampling.rate": 0.5, "privacy.target_epsilon": 0.0, "dp.noise_multiplier": 1.0},
    ),
    "blt_min_separation": (
        "dp_fedavg_mnist",
        {
            **TINY,
            "rounds": 4,
            "eval_every": 4,
            "privacy.target_epsilon": 8.0,
            "dp.noise": "blt",
            "sampling.method": "min_separation",
            "sampling.min_separation": 2,
            "sampling.cohort_size": 4,
        },
    ),
}


def _check_run(name: str, workdir, rounds: int) -> dict:
    """The run's results: its rounds, its config naming your model and source, and
    ``privacy.json`` naming your client ids as the privacy unit (with a formal epsilon where DP
    ran)."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert rows[-1]["round"] == rounds and 0 <= rows[-1]["test_accuracy"] <= 1
    config = json.load(open(os.path.join(workdir, "config.json")))
    assert config["model"]["name"] == "my_cnn" and config["data"]["source"] == "my_clients"
    assert config["data"]["num_clients"] == CLIENTS
    privacy = json.load(open(os.path.join(workdir, "privacy.json")))
    assert "'my_clients'" in privacy["privacy_unit"] and f"{CLIENTS} ids" in privacy["privacy_unit"]
    if name != "fedavg":
        assert privacy["formal"] is True and privacy["unit"] == "client"
    if name == "blt_min_separation":
        assert privacy["epsilon"] == pytest.approx(8.0, abs=0.05)
        assert privacy["accounting"]["noise_strategy"] == "blt"
        assert privacy["sampling"].startswith("2-min-separation")
    if name == "dp_fedavg_poisson":
        from fedjax_dp.privacy import Accountant, PoissonSampling

        event = PoissonSampling(num_clients=CLIENTS, rate=0.5).round_event(1.0)
        expected = Accountant("pld").compose(event, count=2).epsilon(1e-5)
        assert privacy["epsilon"] == pytest.approx(expected, rel=1e-6)
        assert "poisson" in privacy["sampling"].lower()
    return privacy


@pytest.mark.parametrize(
    "name",
    # BLT: ~20 s of its own optimisation (jax_privacy) and ~10 s of calibration on 2 cores
    ["fedavg", "dp_fedavg_poisson", pytest.param("blt_min_separation", marks=pytest.mark.slow)],
)
def test_your_cnn_and_clients_run_through_experiment(name, tmp_path):
    config, overrides = RUNS[name]
    experiment = fedjax_dp.Experiment(config, overrides)
    summary = experiment.run(str(tmp_path), overwrite=True, progress=False)
    assert summary.rounds == overrides["rounds"]
    _check_run(name, tmp_path, overrides["rounds"])


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, ROOT])}
    return subprocess.run(
        [sys.executable, "-m", "fedjax_dp", "--noprogress", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("fedavg", marks=pytest.mark.slow),
        "dp_fedavg_poisson",
        pytest.param("blt_min_separation", marks=pytest.mark.slow),
    ],
)
def test_your_cnn_and_clients_run_through_the_command_with_import(name, tmp_path):
    config, overrides = RUNS[name]
    flags = [f"--config.{k}={v}" for k, v in overrides.items()]
    out = _cli(
        f"--config={config}",
        "--import",
        "test_your_model_and_data",
        *flags,
        f"--workdir={tmp_path}/run",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    _check_run(name, tmp_path / "run", overrides["rounds"])


def test_experiment_takes_the_objects_themselves(tmp_path):
    """``Experiment(..., model=..., data=...)`` registers them and names them in the config; the
    same objects again reuse their names."""
    clients = non_iid_clients(6, seed=1)
    experiment = fedjax_dp.Experiment("fedavg_mnist", TINY_OBJECTS, model=TinyCNN, data=clients)
    again = fedjax_dp.Experiment("fedavg_mnist", TINY_OBJECTS, model=TinyCNN, data=clients)
    assert experiment.config.model.name == again.config.model.name == "my_cnn"
    assert experiment.config.data.source == again.config.data.source != "my_clients"
    assert experiment.config.data.num_clients == 6
    with pytest.raises(ValueError, match="model.name='my_cnn' and model= both given"):
        fedjax_dp.Experiment("fedavg_mnist", {"model.name": "my_cnn"}, model=TinyCNN)


TINY_OBJECTS = {"rounds": 1, "sampling.cohort_size": 2}


def test_a_model_given_as_functions_trains_with_its_own_per_example_loss(tmp_path):
    """``ModelFunctions``: a linear model as init / apply / per-example loss, no flax."""

    def init(key, x):
        return {"w": jax.random.normal(key, (x[0].size, CLASSES)) * 0.01, "b": jnp.zeros(CLASSES)}

    def apply(params, x):
        return x.reshape((x.shape[0], -1)) @ params["w"] + params["b"]

    def loss(params, x, y):
        logits = apply(params, x)
        return jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, y[:, None], -1)[:, 0]

    model = fedjax_dp.ModelFunctions(init, apply, per_example_loss=loss)
    name = fedjax_dp.register_model("linear_functions", model, replace=True)
    summary = fedjax_dp.Experiment("fedavg_mnist", {**TINY, "model.name": name}).run(
        str(tmp_path), overwrite=True, progress=False
    )
    assert summary.rounds == 2 and summary.final["test_loss"] < np.log(CLASSES) + 1


# ---- refused in one line, before any training -------------------------------------------------


class FixedTwo(nn.Module):
    """Two logits, whatever the data: labels 2 do not fit."""

    @nn.compact
    def __call__(self, x):
        return nn.Dense(2)(x.reshape((x.shape[0], -1)))


class WithBatchNorm(nn.Module):
    num_classes: int

    @nn.compact
    def __call__(self, x):
        x = nn.BatchNorm(use_running_average=True)(x.reshape((x.shape[0], -1)))
        return nn.Dense(self.num_classes)(x)


class FlatOnly(nn.Module):
    """Takes 10-feature vectors only: the 6x6x1 examples cannot be applied."""

    num_classes: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], 10)))


def _functions(**kw):
    def init(key, x):
        return {"w": jnp.zeros((x[0].size, CLASSES))}

    def apply(params, x):
        return x.reshape((x.shape[0], -1)) @ params["w"]

    return fedjax_dp.ModelFunctions(**{"init": init, "apply": apply, **kw})


class Widths(nn.Module):
    """A list field: the module cannot be hashed."""

    widths: list
    num_classes: int = CLASSES

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


BAD_MODELS = {
    "unhashable": (Widths([4]), {}, "its module cannot be hashed: give it tuples"),
    "output_width": (
        FixedTwo(),
        {},
        "client 'user-1' (train): label 2 is outside the 2 classes of model 'bad_output_width'",
    ),
    "mean_loss": (
        _functions(per_example_loss=lambda p, x, y: jnp.mean(x) * jnp.sum(p["w"])),
        {},
        "per_example_loss gives shape () for a batch of 2; it must give one loss per example",
    ),
    "integer_parameters": (
        fedjax_dp.ModelFunctions(
            lambda key, x: {"w": jnp.zeros((x[0].size, CLASSES), jnp.int32)},
            lambda p, x: x.reshape((x.shape[0], -1)) @ p["w"].astype(jnp.float32),
        ),
        {},
        "parameter ['w'] is int32; parameters must be float arrays",
    ),
    "batch_statistics": (WithBatchNorm, {}, "keeps variables ['batch_stats'] beside 'params'"),
    "wrong_input_shape": (
        TinyCNN,
        {"input_shape": (28, 28, 1)},
        "takes examples of shape (28, 28, 1) (register_model(input_shape=...)), but the data's",
    ),
    "cannot_apply": (FlatOnly, {}, "cannot be initialised on examples of shape (6, 6, 1)"),
    "stated_classes": (
        TinyCNN,
        {"num_classes": 2},
        "label 2 is outside the 2 classes of model 'bad_stated_classes'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_a_bad_model_is_refused_in_one_line_before_any_training(case, tmp_path, monkeypatch):
    import fedjax_dp.training.run_context as run_context

    model, options, message = BAD_MODELS[case]
    name = fedjax_dp.register_model(f"bad_{case}", model, replace=True, **options)
    monkeypatch.setattr(
        run_context, "build_model_and_round", lambda *a: pytest.fail("the round was built")
    )
    experiment = fedjax_dp.Experiment("fedavg_mnist", {**TINY, "model.name": name})
    with pytest.raises(ValueError) as refused:
        experiment.run(str(tmp_path), overwrite=True, progress=False)
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    assert f"'{name}'" in str(refused.value) or "client 'user-1'" in str(refused.value)


def test_a_personalised_method_states_what_it_needs_before_data_loads(monkeypatch):
    """Prototype methods build on penultimate features: a model without them is refused, naming
    what it needs; one with them passes the check."""
    import fedjax_dp.training.run_context as run_context

    monkeypatch.setattr(run_context, "build_dataset", lambda *a: pytest.fail("data was loaded"))
    fedjax_dp.register_model("no_features", FixedTwo(), replace=True)
    overrides = {"model.name": "no_features", "data.source": "my_clients"}
    with pytest.raises(ValueError, match="whose penultimate features it scores") as refused:
        fedjax_dp.Experiment("fedavg_mnist", {**overrides, "eval_prototypes": True})
    assert "'no_features'" in str(refused.value)
    with pytest.raises(
        ValueError,
        match="features it builds prototypes on .* model.name='no_features' does not give",
    ):
        fedjax_dp.Experiment(
            "fedavg_mnist",
            {**overrides, "algorithm": "pfldyn_proto", "pfldyn.representation": "penultimate"},
        )
    fedjax_dp.Experiment(
        "fedavg_mnist",
        {"model.name": "my_cnn", "data.source": "my_clients", "eval_prototypes": True},
    )


def test_pfldyn_proto_runs_on_your_cnn_and_prototype_evaluation_scores_it(tmp_path):
    overrides = {
        **TINY,
        "rounds": 1,
        "eval_every": 1,
        "algorithm": "pfldyn_proto",
        "pfldyn.representation": "penultimate",
        "pfldyn.local_steps": 2,
        "sampling.cohort_size": 3,
        "client.batch_size": 4,
    }
    overrides.pop("client.epochs")
    summary = fedjax_dp.Experiment("fedavg_mnist", overrides).run(
        str(tmp_path), overwrite=True, progress=False
    )
    assert summary.rounds == 1 and 0 <= summary.final["personalized_accuracy"] <= 1


def _good(k: int, n: int = 4):
    return np.zeros((n,) + SHAPE, np.float32), np.arange(n) % CLASSES


BAD_DATA = {
    "empty_client": (
        {"a": _good(0), "b": (np.zeros((0,) + SHAPE), np.zeros(0, int))},
        {},
        "client 'b' has no training examples",
    ),
    "mismatched_lengths": (
        {"a": _good(0), "b": (np.zeros((5,) + SHAPE), np.zeros(4, int))},
        {},
        "client 'b' (train): x has 5 examples but y has 4",
    ),
    "non_finite": (
        {
            "a": _good(0),
            "b": (
                np.where(np.arange(4)[:, None, None, None] == 2, np.nan, 0.0)
                * np.ones((4,) + SHAPE),
                np.zeros(4, int),
            ),
        },
        {},
        "client 'b' (train): x holds NaN or Inf (example 2)",
    ),
    "label_outside_classes": (
        {"a": _good(0), "b": {"train": _good(1), "test": (np.zeros((1,) + SHAPE), [7])}},
        {"num_classes": CLASSES},
        "client 'b' (test): label 7 (example 0) is outside the 3 classes",
    ),
    "negative_label": (
        {"a": _good(0), "b": (np.zeros((2,) + SHAPE), [0, -1])},
        {},
        "client 'b' (train): label -1 (example 1) is negative",
    ),
    "other_shape": (
        {"a": _good(0), "b": (np.zeros((2, 6, 6)), [0, 1])},
        {},
        "client 'b' (train): examples of shape (6, 6) with labels (), but client 'a' has",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_bad_federated_data_is_refused_in_one_line_naming_the_client(case):
    clients, options, message = BAD_DATA[case]
    with pytest.raises(ValueError) as refused:
        fedjax_dp.register_data(f"bad_{case}", clients, **options)
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    assert f"bad_{case}" not in fedjax_dp.data.source_names()


def test_a_bad_dataset_in_an_imported_module_stops_the_command_in_one_line(tmp_path):
    (tmp_path / "bad_clients.py").write_text(
        "import numpy as np, fedjax_dp\n"
        "fedjax_dp.register_data('bad', {'alice': (np.zeros((3, 2)), np.zeros(2, int))})\n"
    )
    out = _cli("--import", "bad_clients", "--config.data.source=bad", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-2000:]
    assert (
        "--import bad_clients: ValueError: client 'alice' (train): x has 3 examples but y has 2"
        in out.stderr
    )


def test_the_shipped_models_and_sources_are_entries_of_the_same_registries(monkeypatch):
    import fedjax_dp.training.run_context as run_context
    from fedjax_dp.data import sources
    from fedjax_dp.models import registry

    assert {"logistic", "cnn_fedavg", "vgg16", "char_gru", "my_cnn"} <= set(registry.names())
    assert registry.has_penultimate("cnn_fedavg") and not registry.has_penultimate("logistic")
    assert sources.kind("femnist") == "natural" and sources.kind("tfds:mnist") == "pooled"
    assert sources.kind("my_clients") == "clients"
    monkeypatch.setattr(run_context, "build_dataset", lambda *a: pytest.fail("data was loaded"))
    with pytest.raises(ValueError, match="model.name 'my_cnnn' unknown; available: .*'my_cnn'"):
        fedjax_dp.Experiment("fedavg_mnist", {"model.name": "my_cnnn"})
    with pytest.raises(
        ValueError, match="data.source 'my_client' unknown; available: .*'my_clients'"
    ):
        fedjax_dp.Experiment("fedavg_mnist", {"data.source": "my_client"})
    with pytest.raises(ValueError, match="model 'cnn_fedavg' is already registered"):
        fedjax_dp.register_model("cnn_fedavg", TinyCNN, replace=True)
    with pytest.raises(ValueError, match="data source 'mnist' is already registered"):
        fedjax_dp.register_data("mnist", non_iid_clients(2), replace=True)
    with pytest.raises(ValueError, match="data.partition='dirichlet' is not read: data.source="):
        fedjax_dp.Experiment(
            "fedavg_mnist", {"data.source": "my_clients", "data.partition": "dirichlet"}
        )
    with pytest.raises(
        ValueError, match="data.num_clients=5, but data.source='my_clients' gives 12"
    ):
        fedjax_dp.Experiment("fedavg_mnist", {"data.source": "my_clients", "data.num_clients": 5})


def test_a_tfds_builder_with_a_client_feature_becomes_one_client_per_writer(tmp_path):
    """A TFDS builder prepared here (ArrayRecord, no download) whose examples name their writer:
    one client per writer, its test-split examples its local test data, the label feature's class
    count, uint8 images scaled to [0, 1]."""
    import tensorflow_datasets as tfds

    from fedjax_dp.data import build_dataset

    with tfds.core.registered.skip_registration():

        class WriterDigits(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")

            def _info(self):
                features = {
                    "image": tfds.features.Tensor(shape=SHAPE, dtype=np.uint8),
                    "label": tfds.features.ClassLabel(num_classes=4),
                    "writer": tfds.features.Text(),
                }
                return tfds.core.DatasetInfo(
                    builder=self, features=tfds.features.FeaturesDict(features)
                )

            def _split_generators(self, dl_manager):
                return {"train": self._generate_examples(24), "test": self._generate_examples(6)}

            def _generate_examples(self, n):
                for i in range(n):
                    image = np.full(SHAPE, 255 * (i % 2), np.uint8)
                    yield i, {"image": image, "label": i % 3, "writer": f"w{i % 3}"}

    builder = WriterDigits(data_dir=str(tmp_path))
    builder.download_and_prepare(file_format="array_record")
    name = fedjax_dp.register_data("writers", builder, client_feature="writer", replace=True)
    cfg = fedjax_dp.default_config().data
    cfg.source = name
    dataset = build_dataset(cfg, 0)
    assert dataset.metadata["client_ids"] == ("w0", "w1", "w2") and dataset.num_classes == 4
    assert [len(i) for i in dataset.client_train] == [8, 8, 8]
    assert [len(i) for i in dataset.client_test] == [2, 2, 2]
    assert set(np.unique(dataset.y[dataset.client_train[1]])) == {1}
    assert dataset.x.max() == 1.0 and dataset.x.min() == 0.0
    with pytest.raises(ValueError, match="client_feature=..."):
        fedjax_dp.register_data("writers_again", builder)
    fedjax_dp.register_data("no_such", builder, client_feature="author", replace=True)
    cfg.source = "no_such"
    with pytest.raises(ValueError, match="has no client feature 'author'; its features: "):
        build_dataset(cfg, 0)


def test_a_package_entry_point_registers_a_model_and_a_source(tmp_path):
    """An installed package declares ``fedjax_dp.plugins = ...``; ``Experiment`` loads it before it
    checks the config (a distribution's metadata on the path stands for the installed package)."""
    (tmp_path / "my_plugin.py").write_text(
        "import numpy as np, flax.linen as nn, fedjax_dp\n"
        "class Net(nn.Module):\n"
        "    num_classes: int\n"
        "    @nn.compact\n"
        "    def __call__(self, x):\n"
        "        return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))\n"
        "fedjax_dp.register_model('plugin_net', Net)\n"
        "fedjax_dp.register_data('plugin_clients', {k: (np.zeros((3, 2)), [0, 1, 1]) for k in"
        " 'abcd'})\n"
    )
    info = tmp_path / "my_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedjax_dp.plugins]\nmine = my_plugin\n")
    code = (
        "import fedjax_dp\n"
        "e = fedjax_dp.Experiment('fedavg_mnist', {'model.name': 'plugin_net',"
        " 'data.source': 'plugin_clients', 'sampling.cohort_size': 2})\n"
        "print(e.config.model.name, e.config.data.source, e.config.data.num_clients)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["plugin_net", "plugin_clients", "4"]


ALGORITHM_OVERRIDES = {
    "cuag_pfl": {"compression.enabled": True, "pfldyn.local_steps": 2},
    "pfldyn_proto": {"pfldyn.local_steps": 2},
    "prifedsync": {"pfldyn.local_steps": 2},
    "ldp_minibatch": {"server_data.overlap": 0.0},
}
"""What an algorithm needs beyond the tiny run (its own sections' keys), whatever the model."""


def _algorithms():
    from fedjax_dp.algorithms import registry

    return registry.names()


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", _algorithms())
def test_every_algorithm_runs_unchanged_on_your_model_and_data(algorithm, tmp_path):
    from fedjax_dp.algorithms import registry

    overrides = {
        **TINY,
        "rounds": 1,
        "eval_every": 1,
        "algorithm": algorithm,
        "sampling.cohort_size": 3,
        "client.batch_size": 4,
        **ALGORITHM_OVERRIDES.get(algorithm, {}),
    }
    if "client.epochs" in registry.get(algorithm).unread:
        overrides.pop("client.epochs")
    summary = fedjax_dp.Experiment("fedavg_mnist", overrides).run(
        str(tmp_path), overwrite=True, progress=False
    )
    assert summary.rounds == 1 and summary.final


@pytest.mark.slow
@pytest.mark.parametrize(
    "noise, method",
    [
        ("tree", "min_separation"),
        ("tree_restart", "min_separation"),
        ("tree_honaker", "min_separation"),
        ("dense", "min_separation"),
        ("banded", "single"),
        ("banded", "cyclic"),
        ("gaussian", "cyclic_poisson"),
    ],
)
def test_every_noise_family_and_sampler_runs_on_your_model_and_data(noise, method, tmp_path):
    overrides = {
        **TINY,
        "rounds": 4,
        "eval_every": 4,
        "privacy.target_epsilon": 0.0,
        "dp.noise_multiplier": 2.0,
        "dp.noise": noise,
        "sampling.method": method,
    }
    if method in ("min_separation", "cyclic", "cyclic_poisson"):
        overrides["sampling.min_separation"] = 2
    if method in ("min_separation", "single"):
        overrides["sampling.cohort_size"] = 4
    if method == "cyclic_poisson":
        overrides["sampling.rate"] = 0.5
    summary = fedjax_dp.Experiment("dp_fedavg_mnist", overrides).run(
        str(tmp_path), overwrite=True, progress=False
    )
    assert summary.rounds == 4 and summary.formal is True and 0 < summary.epsilon < 100
