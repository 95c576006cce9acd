"""The main job: FedAvg on embedded real MNIST (no download), 100 non-IID clients.

The main job: FedAvg on the embedded real-MNIST subset (5,000 images, no download), 100 clients,
the McMahan/Geyer non-IID shards split (2 shards per client), 10 clients per round, MLP 2NN.

Run: ``fedjax-dp --config fedavg_mnist`` (override any value, e.g.
``--config.rounds=20 --config.model.name=cnn_fedavg``).
"""

from fedjax_dp.training.default_config import default_config


def get_config():
    return default_config()
