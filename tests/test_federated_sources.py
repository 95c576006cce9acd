"""TFDS loaders (offline, tfds.testing.mock_data), ACID/ALID and iid_split partitions, natural
partitions, server-held sets with exact writer overlap, statistics, and the config builder."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from fedjax_dp.data import class_partitions, partition
from fedjax_dp.data.builders import build_dataset
from fedjax_dp.data.describe import describe, plot_label_distribution, statistics
from fedjax_dp.data.natural_clients import GroupedSplit, natural_partition
from fedjax_dp.data.server_sets import iid_server_set, writer_server_set
from fedjax_dp.data.tfds_source import SUPPORTED, load_tfds
from fedjax_dp.training.default_config import default_config
from fixture_files import make_femnist_file, make_shakespeare_dir


@pytest.mark.parametrize(
    "name,shape",
    [
        ("mnist", (28, 28, 1)),
        ("fashion_mnist", (28, 28, 1)),
        ("cifar10", (32, 32, 3)),
        ("cifar100", (32, 32, 3)),
        ("emnist/byclass", (28, 28, 1)),
    ],
)
def test_tfds_loaders_offline_with_mock_data(tmp_path, name, shape):
    with tfds.testing.mock_data(num_examples=9, policy=tfds.testing.MockPolicy.USE_CODE):
        x, y, xt, yt, num_classes = load_tfds(name, data_dir=str(tmp_path))
    assert x.shape == (9, *shape) and xt.shape == (9, *shape) and x.dtype == np.float32
    assert num_classes == SUPPORTED[name][2] and 0 <= y.min() and y.max() < num_classes
    assert 0.0 <= x.min() and x.max() <= 1.0


def test_tfds_without_prepared_data_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="not prepared .* data.download=True"):
        load_tfds("mnist", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="'imagenet2012' is not supported"):
        load_tfds("imagenet2012")


def test_tfds_in_its_default_folder_without_a_prepared_split_says_how_to_get_it(
    tmp_path, monkeypatch
):
    """Found 2026-11-29: ``data.source=tfds:mnist`` with no data.data_dir (TFDS's default folder)
    and no download ended in TFDS's own ``KeyError: Trying to access splits['train'] but splits is
    empty``."""
    import tensorflow_datasets as tfds

    def empty(*args, **kwargs):
        raise KeyError(
            "Trying to access `splits['train']` but `splits` is empty. This likely indicates the"
            " dataset has not been generated yet."
        )

    monkeypatch.setattr(tfds, "data_source", empty)
    with pytest.raises(FileNotFoundError, match="not prepared .* data.download=True"):
        load_tfds("mnist", data_dir=str(tmp_path))


def test_tfds_source_through_the_config(tmp_path):
    cfg = default_config().data
    cfg.update(source="tfds:mnist", data_dir=str(tmp_path), partition="iid", num_clients=3)
    with tfds.testing.mock_data(num_examples=12, policy=tfds.testing.MockPolicy.USE_CODE):
        ds = build_dataset(cfg, seed=0)
    assert ds.num_clients == 3 and len(ds.central_test) == 12


def labels(n=600, c=10, seed=0):
    return np.random.default_rng(seed).integers(0, c, n)


def test_acid_gives_c_classes_with_matching_test_classes_and_no_reuse():
    y, yt = labels(), labels(200, seed=1)
    train, test, class_sets = class_partitions.acid(y, yt, 20, 3, 10, np.random.default_rng(0))
    for tr, te, classes in zip(train, test, class_sets):
        assert len(classes) == 3 and set(np.unique(y[tr])) == set(classes) == set(np.unique(yt[te]))
    for parts, n in ((train, len(y)), (test, len(yt))):
        joined = np.concatenate(parts)
        assert len(np.unique(joined)) == len(joined) == n  # every example used exactly once
    held = np.bincount(np.concatenate(class_sets), minlength=10)
    assert held.max() - held.min() <= 1  # classes are spread evenly over clients


def test_alid_permutation_is_a_bijection_consistent_between_train_and_test():
    y, yt = labels(), labels(200, seed=1)
    rng = np.random.default_rng(0)
    train, test, class_sets = class_partitions.acid(y, yt, 10, 3, 10, rng)
    maps = class_partitions.label_permutations(10, 10, rng)
    y_all = np.concatenate([y, yt])
    test_all = [t + len(y) for t in test]
    relabelled = class_partitions.apply_label_maps(
        y_all, [[a, b] for a, b in zip(train, test_all)], maps
    )
    for k in range(10):
        assert sorted(maps[k].tolist()) == list(range(10))
        for idx in (train[k], test_all[k]):
            np.testing.assert_array_equal(relabelled[idx], maps[k][y_all[idx]])
    assert not np.array_equal(relabelled, y_all)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: class_partitions.acid(labels(), labels(), 5, 11, 10, np.random.default_rng(0)),
            "classes_per_client=11",
        ),
        (
            lambda: class_partitions.acid(
                labels(30), labels(), 40, 1, 10, np.random.default_rng(0)
            ),
            "got no training examples",
        ),
        (
            lambda: partition.dirichlet(labels(), 5, 0.0, np.random.default_rng(0)),
            "alpha must be > 0, got 0.0",
        ),
        (
            lambda: partition.iid_split(5, 3, 4, np.random.default_rng(0)),
            "num_clients=4 exceeds the 3",
        ),
    ],
)
def test_partition_errors_name_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_iid_split_deals_train_and_test():
    train, test = partition.iid_split(100, 30, 10, np.random.default_rng(0))
    assert [len(p) for p in train] == [10] * 10 and [len(p) for p in test] == [3] * 10
    assert len(np.unique(np.concatenate(train))) == 100


def grouped(writers, per, seed=0, classes=62):
    rng = np.random.default_rng(seed)
    n = per * len(writers)
    return GroupedSplit(
        rng.random((n, 2)).astype(np.float32), rng.integers(0, classes, n), np.repeat(writers, per)
    )


def test_natural_partition_selects_writers_with_their_own_data():
    train, test = (
        grouped([f"w{i}" for i in range(8)], 5),
        grouped([f"w{i}" for i in range(2, 12)], 2, seed=1),
    )
    ds = natural_partition(train, test, 4, 62, np.random.default_rng(0), kind="writer")
    ids = ds.metadata["client_ids"]
    # train and test data
    assert len(ids) == 4 and all(w in {f"w{i}" for i in range(2, 8)} for w in ids)
    for k, w in enumerate(ids):
        assert set(ds.x[ds.client_train[k]].ravel()) == set(train.x[train.client == w].ravel())
        assert len(ds.client_test[k]) == 2
    with pytest.raises(
        ValueError, match="num_clients=7 but only 6 writers have training data and test data"
    ):
        natural_partition(train, test, 7, 62, np.random.default_rng(0), kind="writer")


def test_natural_partition_can_skip_writers_with_too_few_training_examples():
    """LEAF's minimum-samples filter (``data.min_train_per_client``): per-step batches of B need n_k
    >= B."""
    writers = [f"w{i}" for i in range(6)]
    per_writer = [3, 9, 4, 12, 8, 20]
    rng = np.random.default_rng(0)
    train = GroupedSplit(
        rng.random((sum(per_writer), 2)).astype(np.float32),
        rng.integers(0, 62, sum(per_writer)),
        np.repeat(writers, per_writer),
    )
    test = grouped(writers, 2, seed=1)
    ds = natural_partition(train, test, 0, 62, np.random.default_rng(0), kind="writer", min_train=8)
    assert ds.metadata["client_ids"] == ("w1", "w3", "w4", "w5") and min(ds.train_sizes()) == 8
    with pytest.raises(
        ValueError, match=r"only 4 writers have training data \(at least 8 examples\) and test data"
    ):
        natural_partition(train, test, 5, 62, np.random.default_rng(0), kind="writer", min_train=8)


@pytest.mark.parametrize("overlap", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_meta_set_writer_overlap_is_exact(overlap):
    train, test = (
        grouped([f"w{i}" for i in range(40)], 10),
        grouped([f"h{i}" for i in range(30)], 10, seed=1),
    )
    training = [f"w{i}" for i in range(25)]
    meta = writer_server_set(
        train, test, training, 40, overlap, np.random.default_rng(0), num_writers=20
    )
    assert len(meta.y) == 40 and len(meta.source_clients) == 20
    assert meta.writer_overlap == overlap
    assert set(meta.overlapping_clients) == set(meta.source_clients) & set(training)


def test_meta_set_errors():
    train, test = (
        grouped([f"w{i}" for i in range(10)], 3),
        grouped([f"h{i}" for i in range(3)], 3, seed=1),
    )
    with pytest.raises(ValueError, match="not a whole number of writers"):
        writer_server_set(train, test, ["w0"], 10, 0.3, np.random.default_rng(0), num_writers=4)
    with pytest.raises(
        ValueError, match="needs 0 training and 4 held-out writers; there are 10 and 3"
    ):
        writer_server_set(
            train,
            test,
            [f"w{i}" for i in range(10)],
            10,
            0.0,
            np.random.default_rng(0),
            num_writers=4,
        )
    assert len(iid_server_set(train.x, train.y, 5, np.random.default_rng(0)).y) == 5
    with pytest.raises(ValueError, match="server set size 31"):
        iid_server_set(train.x, train.y, 31, np.random.default_rng(0))


def test_statistics_and_plot(tmp_path):
    train, test = (
        grouped([f"w{i}" for i in range(6)], 5),
        grouped([f"w{i}" for i in range(6)], 2, seed=1),
    )
    ds = natural_partition(train, test, 6, 62, np.random.default_rng(0))
    s = statistics(ds)
    assert (
        s["train_examples"] == 30
        and s["train_per_client"]["median"] == 5
        and sum(s["label_histogram"]) == 30
    )
    assert "6 clients, 62 classes, 30 train examples" in describe(ds)
    plot_label_distribution(ds, str(tmp_path / "l.png"))
    assert (tmp_path / "l.png").stat().st_size > 1000


def test_builder_natural_sources_from_fixture_files(tmp_path):
    make_femnist_file(tmp_path)
    make_shakespeare_dir(
        tmp_path, {"A": ["hello"], "B": ["there"], "C": ["x"]}, {"A": ["a"], "B": ["b"]}
    )
    cfg = default_config().data
    cfg.update(source="femnist", partition="natural", num_clients=2, data_dir=str(tmp_path))
    ds = build_dataset(cfg, 0)
    assert ds.num_classes == 62 and sorted(ds.metadata["client_ids"]) == ["w0", "w1"]
    cfg.update(source="shakespeare", cache_dir="off")
    ds = build_dataset(cfg, 0)
    assert ds.y.shape[1] == 80 and ds.metadata["pad_id"] == 0 and ds.num_classes == 90
    cfg.update(partition="iid")
    with pytest.raises(ValueError, match="set data.partition='natural'"):
        build_dataset(cfg, 0)
