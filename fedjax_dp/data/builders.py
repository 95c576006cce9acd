"""Builds a ``FederatedDataset`` from a data configuration (source + partition)."""

from __future__ import annotations

import numpy as np

from fedjax_dp.data import partition
from fedjax_dp.data.embedded import load_mnist_5k
from fedjax_dp.data.federated_dataset import FederatedDataset
from fedjax_dp.data.idx_files import load_mnist

SOURCES = ("mnist_5k", "mnist")
PARTITIONS = ("iid", "shards", "dirichlet")


def load_source(source: str, data_dir: str = ""):
    """Returns ``(x_train, y_train, x_test, y_test, num_classes)``; the test arrays are None for a
    source without a separate test split (clients then hold out part of their own data)."""
    if source == "mnist_5k":
        x, y = load_mnist_5k()
        return x, y, None, None, 10
    if source == "mnist":
        return (*load_mnist(data_dir), 10)
    raise ValueError(f"unknown data source {source!r}; available: {SOURCES}")


def partition_indices(labels: np.ndarray, cfg, rng: np.random.Generator) -> list[np.ndarray]:
    if cfg.partition == "iid":
        return partition.iid(labels, cfg.num_clients, rng)
    if cfg.partition == "shards":
        return partition.shards(labels, cfg.num_clients, cfg.shards_per_client, rng)
    if cfg.partition == "dirichlet":
        return partition.dirichlet(labels, cfg.num_clients, cfg.alpha, rng)
    raise ValueError(f"unknown partition {cfg.partition!r}; available: {PARTITIONS}")


def build_dataset(cfg, seed: int) -> FederatedDataset:
    """Partitions a source's training examples over clients; each client keeps ``test_fraction`` of
    its own examples as local test data. The central test set is the source's test split when it
    has one, else the union of the clients' test data."""
    x, y, x_test, y_test, num_classes = load_source(cfg.source, cfg.get("data_dir", ""))
    rng = np.random.default_rng(seed)
    parts = partition_indices(y, cfg, rng)
    train, test = partition.split_train_test(parts, cfg.test_fraction, rng)
    if x_test is not None:
        central = np.arange(len(y), len(y) + len(y_test))
        x, y = np.concatenate([x, x_test]), np.concatenate([y, y_test])
    elif cfg.test_fraction > 0:
        central = np.sort(np.concatenate(test))
    else:
        raise ValueError(f"source {cfg.source!r} has no test split: set data.test_fraction > 0")
    return FederatedDataset(x, y, tuple(train), tuple(test), central, num_classes, name=f"{cfg.source}/{cfg.partition}")
