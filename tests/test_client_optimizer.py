"""The local optimizer's training-side options (``client.grad_clip_norm``, ``client.weight_decay``):
one step against a hand-written one in PyTorch's order (clip the gradient, then add the decay), the
plain optimizer when both are off, the loop's clients built with them, and bad values refused by
key."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.core import tree
from fedjax_dp.core.optimizers import build_optimizer
from fedjax_dp.data.packing import pack_cohort
from fedjax_dp.models import get_model
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.default_config import default_config

from conftest import make_round, random_client_data


@pytest.mark.parametrize("clip, decay", [(0.5, 0.0), (0.0, 0.01), (0.5, 0.01), (100.0, 0.01)])
def test_one_step_clips_the_gradient_then_adds_the_decay(clip, decay):
    w = {"a": jnp.array([1.0, -2.0]), "b": jnp.array([[3.0]])}
    g = {"a": jnp.array([0.3, 0.4]), "b": jnp.array([[1.2]])}  # global norm 1.3
    opt = build_optimizer("sgd", 0.1, weight_decay=decay, grad_clip_norm=clip)
    updates, _ = opt.update(g, opt.init(w), w)
    scale = min(1.0, clip / 1.3) if clip else 1.0
    for k in w:
        expected = -0.1 * (np.asarray(g[k]) * scale + decay * np.asarray(w[k]))
        np.testing.assert_allclose(updates[k], expected, rtol=1e-6)


def test_without_either_option_the_optimizer_is_the_plain_one():
    w = {"a": jnp.ones(3)}
    assert jax.tree_util.tree_structure(
        build_optimizer("sgd", 0.1).init(w)
    ) == jax.tree_util.tree_structure(optax.sgd(0.1).init(w))


def test_the_loops_clients_train_with_the_clipped_steps():
    """Each local step moves a client by at most lr x clip: a tiny clip bounds the whole update."""
    model = get_model("logistic", (4, 4, 1), 3)
    data = random_client_data(np.random.default_rng(0), [12, 12, 12])
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    cohort = pack_cohort(
        x, y, [np.arange(12 * k, 12 * (k + 1)) for k in range(3)], 4, 1, np.random.default_rng(0)
    )
    steps = int(cohort["mask"].any(axis=-1).sum(axis=1).max())
    params = model.init(jax.random.key(0))
    for clip in (0.0, 1e-3):
        runner = make_round(
            model,
            "fedavg",
            num_clients=3,
            **{"client.learning_rate": 0.5, "client.grad_clip_norm": clip},
        )
        result = runner(runner.init(params), cohort, jax.random.key(1))
        moved = float(
            tree.l2_norm(jax.tree_util.tree_map(jnp.subtract, result.state.params, params))
        )
        if clip:
            assert moved <= 0.5 * clip * steps * (1 + 1e-5)
        else:
            assert moved > 0.5 * 1e-3 * steps * 10  # without the clip it moves far more


@pytest.mark.parametrize("key", ["weight_decay", "grad_clip_norm"])
def test_a_negative_value_is_refused_naming_the_key(key):
    cfg = default_config()
    cfg.client[key] = -0.1
    with pytest.raises(ValueError, match=f"client.{key} must be >= 0, got -0.1"):
        validate_config(cfg)
