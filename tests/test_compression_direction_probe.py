"""experiments/compression_direction_probe.py: the first server step rebuilt under each measurement
operator. The rebuilt block steps must be the runs' own w_1 - w_0 (fixed and refreshed matrix), a
block reconstruction keeps every leaf's mean entry whole, and the random operators' reconstructions
are orthogonal projections."""

import jax
import numpy as np
import pytest

from conftest import load_experiment
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment


def _compressed_run(tmp_path_factory, refresh: str, server_mean: str, signs: str) -> str:
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = "cuag_pfl", 1, 1
    c.checkpoint_every, c.checkpoint_keep = 1, 0
    c.data.update(num_clients=10, test_fraction=0.25)
    c.client.update(batch_size=8, learning_rate=0.1)
    c.pfldyn.update(local_steps=3, server_mean=server_mean)
    c.sampling.cohort_size = 4
    c.cuag.mode = "none"
    c.compression.update(enabled=True, kind="block", rates="dynamic", refresh=refresh, signs=signs)
    workdir = str(tmp_path_factory.mktemp("directions") / f"{refresh}_{server_mean}_{signs}")
    run_experiment(c, workdir, progress=False)
    return workdir


@pytest.mark.parametrize(
    "refresh, signs, server_mean, rebuilt",
    [
        ("fixed", "none", "cohort", "block"),
        ("round", "none", "cohort", "block_refreshed"),
        ("fixed", "random", "cohort", "block_signed"),
        ("fixed", "none", "population", "block"),
    ],
)
def test_the_rebuilt_block_step_is_the_runs_own_first_move(
    tmp_path_factory, refresh, signs, server_mean, rebuilt
):
    """w_1 - w_0 = (1 + s) mean Rec(Delta_n): s = 1 with the cohort mean, 4 / 10 with the population
    mean."""
    workdir = _compressed_run(tmp_path_factory, refresh, server_mean, signs)
    report = load_experiment("compression_direction_probe").probe(workdir, 5, kinds=("block",))
    assert report[rebuilt + "_vs_checkpoint"] < 1e-5
    # other matrices: other steps
    for other in {"block", "block_refreshed", "block_signed"} - {rebuilt}:
        assert report[other + "_vs_checkpoint"] > 1e-2
    assert set(report["directions"]) == {
        "uncompressed",
        "shrunk",
        "leaf_means",
        "without_leaf_means",
        "block",
        "block_residual",
        "block_refreshed",
        "block_signed",
    }
    assert list(report["directions"]["block"]["along"]) == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0]


def _layer_tree(rng):
    return {
        "Dense_0": {
            "kernel": rng.normal(size=(6, 8)).astype(np.float32),
            "bias": rng.normal(size=(8,)).astype(np.float32),
        },
        "Dense_1": {
            "kernel": rng.normal(size=(8, 3)).astype(np.float32),
            "bias": rng.normal(size=(3,)).astype(np.float32),
        },
    }


def test_block_keeps_each_leafs_mean_and_random_operators_project():
    probe = load_experiment("compression_direction_probe")
    rng = np.random.default_rng(0)
    initial = _layer_tree(rng)
    # a common shift
    updates = [jax.tree_util.tree_map(lambda v: v + 0.3, _layer_tree(rng)) for _ in range(3)]
    cfg = {"compression": {"rates": "0.3", "r_min": 0.2, "r_max": 0.5, "seed": 0}}
    steps, rates = probe.directions(cfg, initial, updates)
    flat = lambda t: np.concatenate([np.ravel(v) for v in jax.tree_util.tree_leaves(t)])  # noqa: E731
    uncompressed = steps["uncompressed"]
    np.testing.assert_allclose(flat(uncompressed), flat(probe.scaled(probe.mean_of(updates), 2.0)))
    np.testing.assert_allclose(flat(steps["shrunk"]), 0.3 * flat(uncompressed), rtol=1e-6)
    np.testing.assert_allclose(
        flat(steps["leaf_means"]) + flat(steps["without_leaf_means"]),
        flat(uncompressed),
        rtol=1e-6,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        flat(steps["block"]) + flat(steps["block_residual"]),
        flat(uncompressed),
        rtol=1e-6,
        atol=1e-6,
    )
    means = lambda t: np.array([np.mean(v) for v in jax.tree_util.tree_leaves(t)])  # noqa: E731
    # the all-ones vector is in a block matrix's row space
    for name in ("block", "block_refreshed"):
        np.testing.assert_allclose(means(steps[name]), means(uncompressed), rtol=1e-5)
        assert not np.allclose(flat(steps[name]), flat(uncompressed))
    # signed: it is not
    assert not np.allclose(means(steps["block_signed"]), means(uncompressed), rtol=1e-2)
    # min-norm Rec = the orthogonal projection onto Phi's row space
    for name in ("gaussian", "bernoulli"):
        kept, dropped = flat(steps[name]), flat(uncompressed) - flat(steps[name])
        assert abs(kept @ dropped) < 1e-3 * np.linalg.norm(kept) * np.linalg.norm(dropped)
        assert np.linalg.norm(kept) < np.linalg.norm(flat(uncompressed))
        assert not np.allclose(means(steps[name]), means(uncompressed), rtol=1e-2)


def test_shares_of_the_common_part_by_hand():
    probe = load_experiment("compression_direction_probe")
    step = {
        "Dense_0": {"kernel": np.array([[1.0, 1.0], [2.0, 0.0]]), "bias": np.array([1.0, -1.0])}
    }
    # mean over units (last axis): kernel rows [1, 1] (kept whole) and [1, 1] of [2, 0]; bias 0
    total = 1 + 1 + 4 + 0 + 1 + 1
    assert probe.unit_common_share(step)["Dense_0"] == pytest.approx((2 * 1 + 2 * 1 + 0) / total)
    # mean over each leaf: kernel 1.0 over 4 entries, bias 0
    assert probe.leaf_mean_share(step)["Dense_0"] == pytest.approx(4 * 1.0 / total)
    np.testing.assert_allclose(probe.leaf_means(step)["Dense_0"]["kernel"], np.ones((2, 2)))


def test_only_the_updates_the_server_kept_enter_the_step():
    probe = load_experiment("compression_direction_probe")
    assert probe.kept({"a": np.ones(3), "b": np.zeros(2)})
    assert not probe.kept({"a": np.zeros(3), "b": np.zeros(2)})  # a dropped client keeps g_n = 0
    # non-finite: dropped by the server
    assert not probe.kept({"a": np.array([1.0, np.nan]), "b": np.ones(2)})
