"""UGA / FedMeta paper, Shakespeare setting: roles as clients, character GRU.

Seed 002, Fig. 4 setting: Shakespeare, 100 speaking roles as clients, C = 0.1, character GRU
(embedding 8, GRU 256 x 2), SGD lr 0.1 (= eta_meta) decayed 0.992 per round. The seed gives no E;
E = 2 here, so that UGA has a keep-trace epoch (with E = 1 UGA is FedSGD). D_meta / the
shared set: 1 % of the training windows. Needs the Shakespeare files (``data.data_dir``)."""

from fedjax_dp.data.local_files import default_data_dir as data_dir
from fedjax_dp.training.default_config import default_config

LEARNING_RATE = 0.1


def get_config():
    c = default_config()
    c.data.update(
        source="shakespeare", data_dir=data_dir("shakespeare"), partition="natural", num_clients=100
    )
    c.model.name = "char_gru"
    c.client.update(batch_size=8, epochs=2, learning_rate=LEARNING_RATE, lr_decay=0.992)
    c.server.update(learning_rate=1.0, lr_decay=1.0)
    c.fedmeta.update(learning_rate=LEARNING_RATE, lr_decay=0.992)
    c.sampling.cohort_size = 10
    c.rounds, c.eval_every = 400, 5
    return c
