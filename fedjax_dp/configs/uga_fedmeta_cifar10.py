"""UGA / FedMeta paper, Table 1 setting: CIFAR-10 over 10 IID clients.

Seed 002, Table 1 / Fig. 2 setting: CIFAR-10 split IID over 10 clients, C = 0.2 (2 clients per
round), FedAvg CNN (2 conv, 2 pool, 2 dense), SGD lr 0.002 (= eta_meta = eta_g) decayed 0.992 per
round, (E, B) = (1, 64) by default ((1, 16) and (5, 64) by override). D_meta / the shared set: 1 %
of the training examples, IID. Method by override: ``algorithm`` fedavg | fedprox | fedshare | uga
and ``fedmeta.enabled``. Needs the CIFAR-10 files (``data.data_dir``)."""

from fedjax_dp.data.local_files import default_data_dir as data_dir
from fedjax_dp.training.default_config import default_config

LEARNING_RATE = 0.002


def get_config():
    c = default_config()
    c.data.update(
        source="cifar10", data_dir=data_dir("cifar10"), partition="iid_split", num_clients=10
    )
    c.model.name = "cnn_fedavg"
    c.client.update(batch_size=64, epochs=1, learning_rate=LEARNING_RATE, lr_decay=0.992)
    c.server.update(learning_rate=1.0, lr_decay=1.0)  # FedAvg's server; UGA sets eta_g here
    c.fedmeta.update(learning_rate=LEARNING_RATE, lr_decay=0.992)
    c.sampling.cohort_size = 2
    c.rounds, c.eval_every = 200, 5
    return c
