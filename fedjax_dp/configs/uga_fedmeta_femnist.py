"""UGA / FedMeta paper, Tables 2-3 setting: FEMNIST by writer.

Seed 002, Tables 2-3 / Fig. 3 / Fig. 5 setting: FEMNIST, 100 writers as clients, C = 0.1, FedAvg
CNN (62 classes), E = 5, B = 64, SGD lr 0.002 decayed 0.992 per round, eta_g = eta_meta = eta.
D_meta / FedShare's shared set: 1 % of the training examples (``server_data.overlap`` in [0, 1]
draws it from 20 writers with that writer overlap, Fig. 5). Needs the FEMNIST files
(``data.data_dir``)."""

from fedjax_dp.data.local_files import default_data_dir as data_dir
from fedjax_dp.training.default_config import default_config

LEARNING_RATE = 0.002


def get_config():
    c = default_config()
    c.data.update(
        source="femnist", data_dir=data_dir("femnist"), partition="natural", num_clients=100
    )
    c.model.name = "cnn_fedavg"
    c.client.update(batch_size=64, epochs=5, learning_rate=LEARNING_RATE, lr_decay=0.992)
    c.server.update(learning_rate=1.0, lr_decay=1.0)
    c.fedmeta.update(learning_rate=LEARNING_RATE, lr_decay=0.992)
    c.sampling.cohort_size = 10
    c.rounds, c.eval_every = 300, 5
    return c
