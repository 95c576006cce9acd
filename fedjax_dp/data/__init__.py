"""Federated data: the in-memory ``FederatedDataset``, sources and partitions built from a config's
``data`` section, your own clients' data (``register_data``), server-held sets, client sampling
functions and cohort packing."""

from fedjax_dp.data.builders import PARTITIONS, build_dataset, build_server_set
from fedjax_dp.data.client_data import from_clients
from fedjax_dp.data.describe import describe
from fedjax_dp.data.embedded import load_mnist_5k
from fedjax_dp.data.federated_dataset import FederatedDataset
from fedjax_dp.data.packing import pack_cohort
from fedjax_dp.data.sources import names as source_names
from fedjax_dp.data.sources import register_data
from fedjax_dp.data.tfds_clients import tfds_clients

__all__ = [
    "PARTITIONS",
    "build_dataset",
    "build_server_set",
    "describe",
    "from_clients",
    "load_mnist_5k",
    "FederatedDataset",
    "pack_cohort",
    "register_data",
    "source_names",
    "tfds_clients",
]
