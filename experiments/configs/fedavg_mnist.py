"""The main job: FedAvg on the embedded real-MNIST subset (5,000 images, no download), 100 clients,
the McMahan/Geyer non-IID shards split (2 shards per client), 10 clients per round.

Run: ``fedjax-dp --config experiments/configs/fedavg_mnist.py`` (override any value, e.g.
``--config.rounds=20 --config.model.name=cnn_fedavg``).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.rounds = 100
    c.eval_every = 5
    c.algorithm = "fedavg"
    c.data = ml_collections.ConfigDict(dict(
        source="mnist_5k", data_dir="", partition="shards", num_clients=100, shards_per_client=2,
        alpha=0.5, test_fraction=0.2))
    c.model = ml_collections.ConfigDict(dict(name="mlp_2nn"))
    c.client = ml_collections.ConfigDict(dict(optimizer="sgd", learning_rate=0.05, momentum=0.0, batch_size=10, epochs=5))
    c.server = ml_collections.ConfigDict(dict(optimizer="sgd", learning_rate=1.0, momentum=0.0))
    c.sampling = ml_collections.ConfigDict(dict(method="uniform", cohort_size=10, rate=0.1))
    c.engine = ml_collections.ConfigDict(dict(strategy="auto", chunk_size=0, unroll="auto", conv_impl="auto", num_devices=0))
    return c
