"""FedAvg on Shakespeare by speaking role, character GRU (needs the TFF files).

FedAvg on Shakespeare by speaking role (TFF files): 100 roles as clients, 10 per round, character
GRU, client lr 0.1 (the UGA/FedMeta Shakespeare setting, ALGORITHMS.md §2, with FedAvg clients).
Accuracy is over non-padding target characters. Needs the Shakespeare files (``data.data_dir``)."""

from fedjax_dp.data.local_files import default_data_dir as data_dir
from fedjax_dp.training.default_config import default_config


def get_config():
    c = default_config()
    c.data.update(
        source="shakespeare", data_dir=data_dir("shakespeare"), partition="natural", num_clients=100
    )
    c.model.name = "char_gru"
    c.client.update(batch_size=8, epochs=1, learning_rate=0.1)
    c.sampling.cohort_size = 10
    c.rounds = 50
    return c
