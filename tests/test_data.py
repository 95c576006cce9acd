"""Partitioners, sampling and packing: invariants and clear errors."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fedjax_dp.data import partition, sampling
from fedjax_dp.data.embedded import load_mnist_5k
from fedjax_dp.data.federated_dataset import FederatedDataset
from fedjax_dp.data.packing import pack_cohort

LABELS = np.repeat(np.arange(10), 60)  # 600 examples, 60 per class


def assert_disjoint(parts, n, cover=True):
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx)), "an example was assigned twice"
    if cover:
        assert len(allidx) == n


def test_iid_covers_once_with_balanced_sizes():
    parts = partition.iid(LABELS, 7, np.random.default_rng(0))
    assert_disjoint(parts, len(LABELS))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_shards_give_each_client_its_shards_labels():
    # shards of 10: one label each
    parts = partition.shards(LABELS, 30, 2, np.random.default_rng(0))
    assert_disjoint(parts, len(LABELS))
    for p in parts:
        assert len(p) == 20 and len(np.unique(LABELS[p])) <= 2


def test_dirichlet_concentration_follows_alpha():
    labels = np.repeat(np.arange(10), 500)

    def mean_classes_holding_90pct(alpha):
        parts = partition.dirichlet(labels, 20, alpha, np.random.default_rng(1))
        assert_disjoint(parts, len(labels))
        out = []
        for p in parts:
            counts = np.sort(np.bincount(labels[p], minlength=10))[::-1]
            out.append(np.searchsorted(np.cumsum(counts) / counts.sum(), 0.9) + 1)
        return np.mean(out)

    assert (
        mean_classes_holding_90pct(0.1)
        < mean_classes_holding_90pct(1.0)
        < mean_classes_holding_90pct(100.0)
    )


def test_partition_errors_name_the_value():
    with pytest.raises(ValueError, match="alpha must be > 0, got 0"):
        partition.dirichlet(LABELS, 5, 0.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="num_clients=601 exceeds"):
        partition.iid(LABELS, 601, np.random.default_rng(0))


def test_uniform_sampling_is_distinct_and_poisson_rate_checked():
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = sampling.uniform(50, 20, rng)
        assert len(np.unique(ids)) == 20 and ids.max() < 50
    with pytest.raises(ValueError, match="cohort size 51 exceeds the 50"):
        sampling.uniform(50, 51, rng)
    for q in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=f"got {q}"):
            sampling.poisson(50, q, rng)
    counts = [len(sampling.poisson(1000, 0.1, rng)) for _ in range(200)]
    # mean of 200 Binomial(1000, 0.1) draws: sd of the mean = sqrt(90/200) = 0.67; 5 sd bound
    assert abs(np.mean(counts) - 100) < 5 * 0.67


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    batch=st.integers(1, 8),
    epochs=st.integers(1, 3),
)
def test_packing_properties(sizes, batch, epochs):
    x = np.arange(sum(sizes), dtype=np.float32)[:, None]
    y = np.zeros(sum(sizes), np.int32)
    offsets = np.cumsum([0, *sizes])
    clients = [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sizes))]
    cohort = pack_cohort(x, y, clients, batch, epochs, np.random.default_rng(0))
    for c, idx in enumerate(clients):
        real = cohort["example_index"][c][cohort["mask"][c]]
        # every example appears exactly `epochs` times, nothing else appears
        np.testing.assert_array_equal(np.sort(real), np.sort(np.repeat(idx, epochs)))
        np.testing.assert_array_equal(cohort["batches"]["x"][c][cohort["mask"][c]][:, 0], real)
        assert cohort["mask"][c].any(axis=1).sum() == epochs * int(np.ceil(len(idx) / batch))
    assert list(cohort["num_examples"]) == sizes


def test_packing_rejects_bad_input():
    x, y = np.zeros((4, 1), np.float32), np.zeros(4, np.int32)
    with pytest.raises(ValueError, match="batch size must be >= 1, got 0"):
        pack_cohort(x, y, [np.arange(4)], 0, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"hold no examples \(positions \[1\]\)"):
        pack_cohort(x, y, [np.arange(4), np.array([], int)], 2, 1, np.random.default_rng(0))


def test_dataset_validation():
    x, y = np.zeros((4, 2), np.float32), np.array([0, 1, 0, 1], np.int32)
    ok = (np.arange(2), np.arange(2, 4))
    with pytest.raises(ValueError, match="x has 4 examples but y has 3"):
        FederatedDataset(x, y[:3], ok, ok, np.arange(4), 2)
    bad = x.copy()
    bad[2, 1] = np.inf
    with pytest.raises(ValueError, match="NaN or Inf .first at example 2"):
        FederatedDataset(bad, y, ok, ok, np.arange(4), 2)
    with pytest.raises(ValueError, match=r"clients \[1\] have no training examples"):
        FederatedDataset(x, y, (np.arange(4), np.array([], int)), ok, np.arange(4), 2)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        FederatedDataset(x, y + 1, ok, ok, np.arange(4), 2)


def test_embedded_mnist_is_real_and_balanced():
    x, y = load_mnist_5k()
    assert x.shape == (5000, 28, 28, 1) and x.dtype == np.float32
    assert 0.0 <= x.min() and x.max() <= 1.0
    np.testing.assert_array_equal(np.bincount(y), [500] * 10)
    assert 0.1 < x.mean() < 0.16  # MNIST's mean pixel intensity is about 0.13


@pytest.mark.parametrize(
    "overrides, message",
    [
        # numpy's "expected non-negative integer" after loading, before
        ({"seed": -1}, "seed must be >= 0"),
        ({"compression.enabled": True, "compression.seed": -1}, "compression.seed must be >= 0"),
        (
            {"data.partition": "acid", "data.classes_per_client": -1},
            "data.classes_per_client must be >= 1",
        ),
        (
            {"data.partition": "alid", "data.max_train_per_client": -1},
            "data.max_train_per_client must be >= 0",
        ),
        (
            {"data.partition": "acid", "data.max_test_per_client": -2},
            "data.max_test_per_client must be >= 0",
        ),
    ],
)
def test_negative_seeds_and_per_client_limits_are_refused_by_name(overrides, message):
    """A negative max_*_per_client used to mean 'all' silently; a negative seed failed after the
    data loaded with an error that named no key."""
    from fedjax_dp.training.config_validation import validate_config
    from fedjax_dp.training.default_config import default_config

    cfg = default_config()
    for path, value in overrides.items():
        *sections, key = path.split(".")
        (cfg[sections[0]] if sections else cfg)[key] = value
    with pytest.raises(ValueError, match=message):
        validate_config(cfg)


def test_shards_that_outnumber_the_examples_name_both_keys_and_the_product():
    """Found 2026-12-01 (a new-user trial): ``data.num_clients=100000`` on the shards split said
    "num_clients=200000 exceeds the 5000 examples": a number the user never wrote (the shard
    count)."""
    with pytest.raises(
        ValueError,
        match=r"num_clients x shards_per_client = 301 x 2 = 602 shards exceed the 600 "
        r"examples available",
    ):
        partition.shards(LABELS, 301, 2, np.random.default_rng(0))


def _mnist_5k_dataset(**client):
    from fedjax_dp.data.builders import build_dataset
    from fedjax_dp.training.default_config import default_config

    cfg = default_config()
    cfg.client.update(**client)
    return cfg, build_dataset(cfg.data, cfg.seed)


def test_a_batch_larger_than_every_client_packs_each_epoch_as_one_batch_of_the_largest_size():
    """Bug (found 2026-12-01, a new-user trial): ``client.batch_size=100000`` on ``fedavg_mnist``
    packed every round's cohort at a width of 100,000 examples (10 clients x 5 epochs x 100,000 x 3
    KB = 16 GB) and the OOM killer ended the run without a word. A batch of B >= n_k is the client's
    whole data (B = infinity, McMahan et al. 2017), so the packed width is the largest client's
    size: the same steps, examples and masked means."""
    from fedjax_dp.core.algorithm import Requirements
    from fedjax_dp.training.cohorts import make_packer

    cfg, dataset = _mnist_5k_dataset(batch_size=100_000, epochs=2)
    largest = int(dataset.train_sizes().max())
    huge = make_packer(cfg, dataset, Requirements())([0, 1, 2], np.random.default_rng(0), None)
    cfg.client.batch_size = largest
    exact = make_packer(cfg, dataset, Requirements())([0, 1, 2], np.random.default_rng(0), None)
    assert huge["mask"].shape == (3, 2, largest)
    for key in ("mask", "example_index", "num_examples"):
        np.testing.assert_array_equal(huge[key], exact[key])
    np.testing.assert_array_equal(huge["batches"]["x"], exact["batches"]["x"])
    # UGA's packer: its keep-trace batches and its evaluation pass alike
    cfg.client.batch_size = 100_000
    uga = make_packer(cfg, dataset, Requirements(evaluation_pass=True))(
        [0], np.random.default_rng(0), None
    )
    assert uga["mask"].shape[-1] == uga["eval_mask"].shape[-1] == largest


def test_a_cohort_that_cannot_fit_in_memory_is_refused_naming_the_keys_before_training():
    """A typo such as ``client.epochs=500000`` packed a cohort of many times the machine's memory
    and was killed; now the packer is refused at build time, naming the keys that size it and the
    bytes needed."""
    from fedjax_dp.core.algorithm import Requirements
    from fedjax_dp.training.cohorts import make_packer

    cfg, dataset = _mnist_5k_dataset(epochs=5_000_000)
    with pytest.raises(
        ValueError,
        match=r"one round's packed cohort needs .* GB .*more than this machine's .* GB of "
        r"memory.*client.epochs=5000000.*client.batch_size=10.*sampling.cohort_size=10",
    ):
        make_packer(cfg, dataset, Requirements())
