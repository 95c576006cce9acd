"""``eval_prototypes``: the prototype adaptation of a global classifier (the PFLDyn authors' "Proto
A.", seed 004's personalised metric for SCAFFOLD) equals a per-client loop on the penultimate
features, runs beside the global model's own accuracy, and needs a model with a hidden layer."""

import json

import jax
import numpy as np
import pytest

from fedjax_dp.data.builders import build_dataset
from fedjax_dp.models import get_model
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment
from fedjax_dp.training.personalized_evaluation import PersonalizedEvaluator
from fedjax_dp.training.prototype_adaptation import PrototypeAdaptation

from conftest import make_round


def _config(**overrides):
    c = default_config()
    c.rounds, c.eval_every = 2, 2
    c.data.update(num_clients=8, test_fraction=0.25)
    c.model.name = "mlp_2nn"
    c.client.update(batch_size=16, epochs=1)
    c.sampling.cohort_size = 3
    c.engine.update(strategy="vmap", unroll="1")
    c.eval_prototypes = True
    for path, value in overrides.items():
        section, _, key = path.rpartition(".")
        (c[section] if section else c)[key] = value
    return c


def test_prototype_accuracy_equals_a_per_client_loop_on_the_penultimate_features():
    c = _config()
    dataset = build_dataset(c.data, c.seed)
    model = get_model("mlp_2nn", dataset.example_shape, dataset.num_classes)
    runner = make_round(model, "fedavg", num_clients=dataset.num_clients)
    state = runner.init(model.init(jax.random.key(3)))
    got = PersonalizedEvaluator(dataset, chunk=3).per_client_accuracy(
        PrototypeAdaptation(model), state
    )
    for k, (train, test) in enumerate(zip(dataset.client_train, dataset.client_test)):
        support = np.asarray(model.apply(state.params, dataset.x[train], penultimate=True))
        query = np.asarray(model.apply(state.params, dataset.x[test], penultimate=True))
        means = {c: support[dataset.y[train] == c].mean(0) for c in np.unique(dataset.y[train])}
        predicted = [min(means, key=lambda c: np.sum((e - means[c]) ** 2)) for e in query]
        np.testing.assert_allclose(
            got[k], np.mean(np.asarray(predicted) == dataset.y[test]), atol=1e-6
        )


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_a_run_reports_the_prototype_accuracy_beside_the_global_models(tmp_path, algorithm):
    run_experiment(_config(algorithm=algorithm), str(tmp_path / "run"), progress=False)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    final = [r for r in rows if "client_accuracy" in r][-1]
    assert (
        final["round"] == 2
        and 0 <= final["personalized_accuracy"] <= 1
        and 0 <= final["client_accuracy"] <= 1
    )
    assert final["personalized_accuracy"] != final["client_accuracy"]  # two metrics, not one copied


def test_off_by_default_and_refused_for_a_model_without_a_hidden_layer(tmp_path):
    assert default_config().eval_prototypes is False
    with pytest.raises(
        ValueError,
        match="eval_prototypes needs a model with a hidden layer .* got model.name='logistic'",
    ):
        validate_config(_config(**{"model.name": "logistic"}))
