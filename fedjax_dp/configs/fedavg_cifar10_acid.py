"""FedAvg on CIFAR-10 ACID-3: the non-personalised reference for CUAG-PFL.

FedAvg on CIFAR-10 ACID-3 (each of 100 clients holds 3 classes, local test data of the same
classes; PFLDyn/CUAG-PFL split, ALGORITHMS.md §4): the non-personalised reference. Switch to ALID
with ``--config.data.partition=alid``. Needs the CIFAR-10 files (``data.data_dir``)."""

from fedjax_dp.data.local_files import default_data_dir as data_dir
from fedjax_dp.training.default_config import default_config


def get_config():
    c = default_config()
    c.data.update(
        source="cifar10",
        data_dir=data_dir("cifar10"),
        partition="acid",
        num_clients=100,
        classes_per_client=3,
    )
    c.model.name = "cnn_fedavg"
    c.client.update(batch_size=50, epochs=1, learning_rate=0.05)
    c.sampling.cohort_size = 10
    return c
