"""FedAvg on FEMNIST by writer (LEAF), FedAvg CNN (needs the FEMNIST files).

FedAvg on FEMNIST by writer (LEAF): 100 writers as clients, 10 per round, FedAvg CNN with 62
outputs, E=5, B=64 (the UGA/FedMeta FEMNIST setting, ALGORITHMS.md §2, with FedAvg clients).
Needs the FEMNIST files (``data.data_dir``; default ``$FEDJAX_DP_DATA/femnist``)."""

from fedjax_dp.data.local_files import default_data_dir as data_dir
from fedjax_dp.training.default_config import default_config


def get_config():
    c = default_config()
    c.data.update(
        source="femnist", data_dir=data_dir("femnist"), partition="natural", num_clients=100
    )
    c.model.name = "cnn_fedavg"
    c.client.update(batch_size=64, epochs=5, learning_rate=0.05)
    c.sampling.cohort_size = 10
    return c
