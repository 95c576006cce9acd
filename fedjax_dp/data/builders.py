"""Builds a ``FederatedDataset`` from a data configuration (source + partition).

Sources (registered in ``data.sources``, where yours join them: ``register_data``): ``mnist_5k``
(embedded, no download), ``mnist``, ``cifar10``, ``cifar100`` (a non-canonical split:
``cifar_files``), ``femnist``, ``shakespeare`` (local files under ``data.data_dir``) and
``tfds:<name>`` (tensorflow-datasets).
Partitions: label-based ``iid``, ``shards``, ``dirichlet`` (clients hold out ``test_fraction`` of
their own data), ``iid_split``, ``acid``, ``alid`` (clients get local test data from the test
split), and ``natural`` (one client per writer or speaking role). A source that gives its own
clients reads no partition.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.data import class_partitions, partition, sources
from fedjax_dp.data.cifar_files import NUM_CLASSES, load_cifar10
from fedjax_dp.data.embedded import load_mnist_5k
from fedjax_dp.data.federated_dataset import FederatedDataset
from fedjax_dp.data.femnist_files import NUM_CLASSES as FEMNIST_CLASSES
from fedjax_dp.data.femnist_files import load_femnist
from fedjax_dp.data.idx_files import load_mnist
from fedjax_dp.data.natural_clients import natural_partition
from fedjax_dp.data.normalization import standardize
from fedjax_dp.data.server_sets import ServerSet, default_size, iid_server_set, writer_server_set
from fedjax_dp.data.shakespeare_files import PAD_ID, SEQUENCE_LENGTH, VOCAB_SIZE, load_shakespeare

LABEL_PARTITIONS = ("iid", "shards", "dirichlet")
SPLIT_PARTITIONS = ("iid_split", "acid", "alid")
PARTITIONS = LABEL_PARTITIONS + SPLIT_PARTITIONS + ("natural",)


def _cache_dir(cfg) -> str | None:
    """'' -> the default cache directory, 'off' -> no disk cache, else the given folder."""
    value = cfg.get("cache_dir", "")
    return None if not value else ("" if value == "off" else value)


def load_source(cfg):
    """Returns ``(x_train, y_train, x_test, y_test, num_classes)`` of a pooled source; the test
    arrays are None for a source without a separate test split (clients then hold out part of their
    own data)."""
    entry = sources.get(cfg.source)
    if entry.kind == "natural":
        raise ValueError(
            f"source {cfg.source!r} is partitioned by its natural clients: set"
            " data.partition='natural'"
        )
    if entry.kind == "clients":
        raise ValueError(
            f"source {cfg.source!r} gives its own clients: it has no pool to partition"
        )
    return entry.load(cfg)


def _tfds(cfg):
    from fedjax_dp.data.tfds_source import load_tfds

    return load_tfds(
        cfg.source[5:],
        cfg.get("data_dir", ""),
        cfg.get("download", False),
        cfg.get("manual_dir", ""),
    )


def _label_partition(labels: np.ndarray, cfg, rng: np.random.Generator) -> list[np.ndarray]:
    if cfg.partition == "iid":
        return partition.iid(labels, cfg.num_clients, rng)
    if cfg.partition == "shards":
        return partition.shards(labels, cfg.num_clients, cfg.shards_per_client, rng)
    return partition.dirichlet(labels, cfg.num_clients, cfg.alpha, rng)


def _natural(cfg, rng) -> FederatedDataset:
    name = f"{cfg.source}/natural"
    train, test = _natural_splits(cfg)
    min_train = int(cfg.get("min_train_per_client", 0))
    if cfg.source == "femnist":
        return natural_partition(
            train,
            test,
            cfg.num_clients,
            FEMNIST_CLASSES,
            rng,
            name=name,
            kind="writer",
            min_train=min_train,
        )
    seq = int(cfg.get("sequence_length", SEQUENCE_LENGTH))
    return natural_partition(
        train,
        test,
        cfg.num_clients,
        VOCAB_SIZE,
        rng,
        name=name,
        kind="role",
        metadata={"pad_id": PAD_ID, "sequence_length": seq},
        min_train=min_train,
    )


def _from_splits(cfg, x, y, x_test, y_test, num_classes, rng) -> FederatedDataset:
    """Clients get local train data from the train split and local test data from the test split."""
    if x_test is None:
        raise ValueError(
            f"partition {cfg.partition!r} needs a source with a test split; {cfg.source!r} has none"
        )
    name, metadata = f"{cfg.source}/{cfg.partition}", {}
    if cfg.partition == "iid_split":
        train, test = partition.iid_split(len(y), len(y_test), cfg.num_clients, rng)
    else:
        train, test, class_sets = class_partitions.acid(
            y,
            y_test,
            cfg.num_clients,
            cfg.classes_per_client,
            num_classes,
            rng,
            cfg.get("max_train_per_client", 0),
            cfg.get("max_test_per_client", 0),
        )
        name += f"{cfg.classes_per_client}"
        metadata["client_classes"] = tuple(c.tolist() for c in class_sets)
    test = [t + len(y) for t in test]
    x_all, y_all = np.concatenate([x, x_test]), np.concatenate([y, y_test])
    central = np.arange(len(y), len(y_all))
    if cfg.partition == "alid":
        maps = class_partitions.label_permutations(cfg.num_clients, num_classes, rng)
        y_all = class_partitions.apply_label_maps(
            y_all, [[a, b] for a, b in zip(train, test)], maps
        )
        metadata["label_maps"] = maps
        # relabelled per client: only client test sets are meaningful
        central = np.sort(np.concatenate(test))
    return FederatedDataset(
        x_all, y_all, tuple(train), tuple(test), central, num_classes, name=name, metadata=metadata
    )


def build_dataset(cfg, seed: int) -> FederatedDataset:
    """The configured federated dataset. Label partitions keep ``test_fraction`` of each client's
    examples as its local test data; the central test set is the source's test split when it has
    one, else the union of the clients' test data."""
    entry = sources.get(cfg.source)
    if entry.kind == "clients":
        return entry.load(cfg, seed)
    rng = np.random.default_rng(seed)
    if cfg.partition not in PARTITIONS:
        raise ValueError(f"unknown partition {cfg.partition!r}; available: {PARTITIONS}")
    if cfg.partition == "natural":
        if entry.kind != "natural":
            natural = [n for n in sources.names() if sources.kind(n) == "natural"]
            raise ValueError(
                f"partition 'natural' needs a source with natural clients {natural}, got"
                f" {cfg.source!r}"
            )
        return entry.load(cfg, rng)
    x, y, x_test, y_test, num_classes = load_source(cfg)
    if cfg.get("normalize", "none") == "channel":
        x, x_test = standardize(x, cfg.source), standardize(x_test, cfg.source)
    if cfg.partition in SPLIT_PARTITIONS:
        return _from_splits(cfg, x, y, x_test, y_test, num_classes, rng)
    parts = _label_partition(y, cfg, rng)
    train, test = partition.split_train_test(parts, cfg.test_fraction, rng)
    if x_test is not None:
        central = np.arange(len(y), len(y) + len(y_test))
        x, y = np.concatenate([x, x_test]), np.concatenate([y, y_test])
    elif cfg.test_fraction > 0:
        central = np.sort(np.concatenate(test))
    else:
        raise ValueError(f"source {cfg.source!r} has no test split: set data.test_fraction > 0")
    return FederatedDataset(
        x, y, tuple(train), tuple(test), central, num_classes, name=f"{cfg.source}/{cfg.partition}"
    )


def _natural_splits(cfg):
    if cfg.source == "femnist":
        return load_femnist(cfg.data_dir, bool(cfg.get("invert", False)))
    return load_shakespeare(
        cfg.data_dir, int(cfg.get("sequence_length", SEQUENCE_LENGTH)), _cache_dir(cfg)
    )


def build_server_set(
    data_cfg, server_cfg, dataset: FederatedDataset, seed: int
) -> tuple[ServerSet, FederatedDataset]:
    """``(server-held set, dataset)``: the set (FedMeta's D_meta, FedShare's shared set, a
    validation set) is ``server_cfg.fraction`` of the clients' training examples in size.
    ``server_cfg.overlap`` < 0 draws it IID from the training clients' data (the paper's default;
    the dataset is unchanged, so the set is the clients' own data). ``overlap`` in [0, 1] on natural
    partitions draws it from ``num_writers`` writers of whom exactly that fraction are training
    clients (seed 002 §4.4); ``overlap`` = 0 on a label partition holds the drawn examples OUT of
    the clients' training data (the returned dataset no longer has them), so the set is disjoint
    from every client's data; so does ``overlap`` = 0 on a source that gives its own clients."""
    rng = np.random.default_rng([seed, 7])
    size = default_size(int(dataset.train_sizes().sum()), server_cfg.fraction)
    if server_cfg.overlap < 0:
        pool = np.concatenate(dataset.client_train)
        return iid_server_set(dataset.x[pool], dataset.y[pool], size, rng), dataset
    if data_cfg.partition != "natural" or sources.kind(data_cfg.source) != "natural":
        if server_cfg.overlap != 0:
            raise ValueError(
                f"server_data.overlap={server_cfg.overlap} needs writers: partition 'natural'"
                f" (femnist or shakespeare), got {data_cfg.partition!r}; 0 holds the set out of the"
                " clients"
            )
        return held_out_server_set(dataset, size, rng)
    train, test = _natural_splits(data_cfg)
    return (
        writer_server_set(
            train,
            test,
            list(dataset.metadata["client_ids"]),
            size,
            server_cfg.overlap,
            rng,
            server_cfg.num_writers,
        ),
        dataset,
    )


def held_out_server_set(dataset: FederatedDataset, size: int, rng: np.random.Generator):
    """``size`` training examples drawn uniformly from the clients' pooled training data and removed
    from it: ``(ServerSet, the dataset without them)``. A client left with no example is an
    error."""
    pool = np.concatenate(dataset.client_train)
    if not 1 <= size < len(pool):
        raise ValueError(f"server set size {size} must lie in [1, {len(pool)})")
    taken = np.sort(rng.choice(pool, size, replace=False))
    train = tuple(np.setdiff1d(idx, taken) for idx in dataset.client_train)
    emptied = [k for k, idx in enumerate(train) if len(idx) == 0]
    if emptied:
        raise ValueError(
            f"holding out {size} examples for the server (server_data.fraction) leaves clients"
            f" {emptied[:10]} without training data; lower server_data.fraction"
        )
    remaining = dataclasses.replace(dataset, client_train=train)
    return ServerSet(dataset.x[taken], dataset.y[taken]), remaining


def _cifar(name: str):
    def load(cfg):
        data = load_cifar10(cfg.get("data_dir", ""), _cache_dir(cfg), name)
        return (*data, NUM_CLASSES[name])

    return load


sources.register("mnist_5k", "pooled", lambda cfg: (*load_mnist_5k(), None, None, 10), shipped=True)
sources.register(
    "mnist", "pooled", lambda cfg: (*load_mnist(cfg.get("data_dir", "")), 10), shipped=True
)
for _name in NUM_CLASSES:  # cifar10, cifar100
    sources.register(_name, "pooled", _cifar(_name), shipped=True)
sources.register("femnist", "natural", _natural, shipped=True)
sources.register("shakespeare", "natural", _natural, shipped=True)
sources.register("tfds:", "pooled", _tfds, prefix=True, shipped=True)
