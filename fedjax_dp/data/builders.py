"""Builds a ``FederatedDataset`` from a data configuration (source + partition)."""

from __future__ import annotations

import numpy as np

from fedjax_dp.data import partition
from fedjax_dp.data.embedded import load_mnist_5k
from fedjax_dp.data.federated_dataset import FederatedDataset

SOURCES = ("mnist_5k",)
PARTITIONS = ("iid", "shards", "dirichlet")


def load_source(source: str, data_dir: str = "") -> tuple[np.ndarray, np.ndarray, int]:
    """Returns ``(x, y, num_classes)`` of a named source."""
    del data_dir  # used by the file-based sources
    if source == "mnist_5k":
        x, y = load_mnist_5k()
        return x, y, 10
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
    """Partitions a source's examples over clients; each client keeps ``test_fraction`` of its own
    examples as local test data, and the union of those is the central test set."""
    x, y, num_classes = load_source(cfg.source, cfg.get("data_dir", ""))
    rng = np.random.default_rng(seed)
    parts = partition_indices(y, cfg, rng)
    train, test = partition.split_train_test(parts, cfg.test_fraction, rng)
    central = np.sort(np.concatenate(test)) if cfg.test_fraction > 0 else np.sort(np.concatenate(train))
    return FederatedDataset(x, y, tuple(train), tuple(test), central, num_classes, name=f"{cfg.source}/{cfg.partition}")
