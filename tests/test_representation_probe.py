"""experiments/representation_probe.py: dead units and feature spread per round, and round 1 taken
apart (each client's local model rebuilt from its g_n; PFLDyn's first server step is twice the
cohort's mean update)."""

import jax
import numpy as np
import pytest

from conftest import load_experiment
from fedjax_dp.core import rng as rng_lib
from fedjax_dp.data.builders import build_dataset
from fedjax_dp.models import get_model
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment


@pytest.fixture(scope="module")
def pfldyn_run(tmp_path_factory):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = "pfldyn_proto", 2, 2
    c.checkpoint_every, c.checkpoint_keep = 1, 0
    c.data.update(num_clients=10, test_fraction=0.25)
    c.client.update(batch_size=8, learning_rate=0.1)
    c.pfldyn.local_steps = 3
    c.sampling.cohort_size = 4
    workdir = str(tmp_path_factory.mktemp("probe") / "run")
    run_experiment(c, workdir, progress=False)
    return c, workdir


def test_readings_per_round_and_the_dead_fraction_by_hand(pfldyn_run):
    c, workdir = pfldyn_run
    probe = load_experiment("representation_probe")
    rows = probe.probe_run(workdir, per_client=5)
    assert [row["round"] for row in rows] == [0, 1, 2]
    # call order: the output layer last
    assert list(rows[0]["layers"]) == ["Dense_0", "Dense_1", "Dense_2"]
    assert "moved" not in rows[0]["layers"]["Dense_0"] and rows[1]["layers"]["Dense_0"]["moved"] > 0
    assert rows[1]["cosine_to_first_move"] == pytest.approx(1.0)
    dataset = build_dataset(c.data, c.seed)
    x, owner = probe.sampled_examples(dataset, 5, c.seed)
    assert np.bincount(owner).tolist() == [5] * 10
    params = get_model("mlp_2nn", dataset.example_shape, dataset.num_classes).init(
        rng_lib.run_streams(c.seed, False).model_init
    )
    pre = x.reshape(len(x), -1) @ np.asarray(params["Dense_0"]["kernel"]) + np.asarray(
        params["Dense_0"]["bias"]
    )
    assert rows[0]["layers"]["Dense_0"]["active"] == pytest.approx(np.mean(pre > 0), abs=1e-6)
    assert rows[0]["layers"]["Dense_0"]["dead"] == pytest.approx(
        np.mean(np.all(pre <= 0, axis=0)), abs=1e-9
    )


def test_round_one_rebuilds_the_local_models_and_twice_the_mean_is_the_server_step(pfldyn_run):
    _, workdir = pfldyn_run
    one = load_experiment("representation_probe").round_one(workdir, per_client=5)
    assert len(one["clients"]) == len(one["local_models"]) == 4 and 0 < one["mean_update_norm"]
    # PFLDyn with the cohort mean: w_1 = w_0 + 2 mean Delta, so the rebuilt step and the checkpoint
    # agree
    for name, reading in one["checkpoint_w1"].items():
        for key, value in reading.items():
            assert one["w0_plus_twice_mean"][name][key] == pytest.approx(value, rel=1e-4, abs=1e-6)
            assert one["along_the_first_move"][1.0][name][key] == pytest.approx(
                value, rel=1e-4, abs=1e-6
            )
    assert one["w0_plus_mean"] != one["checkpoint_w1"]
    assert jax.tree_util.tree_leaves(one["initial"]) != jax.tree_util.tree_leaves(
        one["checkpoint_w1"]
    )
