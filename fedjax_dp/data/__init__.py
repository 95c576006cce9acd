"""Federated data: the in-memory ``FederatedDataset``, sources and partitions built from a config's
``data`` section, server-held sets, client sampling functions and cohort packing."""

from fedjax_dp.data.builders import PARTITIONS, SOURCES, build_dataset, build_server_set
from fedjax_dp.data.describe import describe
from fedjax_dp.data.embedded import load_mnist_5k
from fedjax_dp.data.federated_dataset import FederatedDataset
from fedjax_dp.data.packing import pack_cohort

__all__ = [
    "PARTITIONS",
    "SOURCES",
    "build_dataset",
    "build_server_set",
    "describe",
    "load_mnist_5k",
    "FederatedDataset",
    "pack_cohort",
]
