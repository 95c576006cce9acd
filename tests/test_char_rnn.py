"""The character GRU's padding-masked loss and accuracy, and one FedAvg round on Shakespeare-format
fixture data through the experiment loop."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.models.char_rnn import char_gru
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment
from fixture_files import make_shakespeare_dir


def test_loss_and_accuracy_ignore_padding_targets():
    model = char_gru(sequence_length=6, vocab_size=12, hidden=(16,))
    params = model.init(jax.random.PRNGKey(0))
    x = jnp.array([[3, 4, 5, 0, 0, 0], [1, 2, 3, 4, 5, 6]])
    y = jnp.array([[4, 5, 0, 0, 0, 0], [2, 3, 4, 5, 6, 7]])
    logits = model.apply(params, x)
    token_losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    expected = jnp.array([token_losses[0, :2].mean(), token_losses[1].mean()])
    np.testing.assert_allclose(
        model.per_example_loss(params, {"x": x, "y": y}), expected, rtol=1e-6
    )
    hits = (jnp.argmax(logits, -1) == y).astype(jnp.float32)
    np.testing.assert_allclose(
        model.per_example_correct(params, {"x": x, "y": y}),
        [hits[0, :2].mean(), hits[1].mean()],
        rtol=1e-6,
    )


def test_the_small_character_gru_is_one_gru_of_128_units():
    from fedjax_dp.models import get_model

    small, full = get_model("char_gru_small", (20,), 90), get_model("char_gru", (20,), 90)
    assert (
        small.name == "char_gru_small"
        and small.module.hidden == (128,)
        and full.module.hidden == (256, 256)
    )
    params = small.init(jax.random.PRNGKey(0))
    assert small.apply(params, jnp.zeros((2, 20), jnp.int32)).shape == (2, 20, 90)


@pytest.mark.parametrize("model_name", ["char_gru", "char_gru_small"])
def test_fedavg_round_on_shakespeare_fixture(tmp_path, model_name):
    lines = [
        "To be, or not to be, that is the question.",
        "Whether 'tis nobler in the mind to suffer",
    ]
    make_shakespeare_dir(
        tmp_path,
        {f"R{i}": lines * (i + 1) for i in range(4)},
        {f"R{i}": lines[:1] for i in range(4)},
    )
    cfg = default_config()
    cfg.data.update(
        source="shakespeare",
        data_dir=str(tmp_path),
        partition="natural",
        num_clients=4,
        cache_dir="off",
        sequence_length=20,
    )
    cfg.model.name = model_name
    cfg.client.update(batch_size=4, epochs=1, learning_rate=0.5)
    cfg.sampling.cohort_size = 2
    cfg.update(rounds=2, eval_every=1)
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    assert summary.rounds == 2 and 0.0 <= summary.best_accuracy <= 1.0
