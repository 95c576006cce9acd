"""Distributed DP on federated EMNIST: the distributed discrete Gaussian's EMNIST setting
(Kairouz, Liu and Steinke 2021, Sec. 6; google-research/federated ``distributed_dp/fl_run.py``).

From the paper's setting: TensorFlow Federated's federated EMNIST (3,400 writers, 62 classes), 100
clients a round out of 3,400, 1,500 rounds, one local epoch, clip 0.03, 16 bits, beta = e^-0.5,
k_stddevs = 4, epsilon 10. Ours, where the paper's differ: the clients are Poisson-sampled at
q = 100 / 3,400 (the accounting this library can prove; the paper sampled exactly 100 and accounted
them as Poisson), delta = 1 / 3,400 (fl_run's default: 1 / the population), the FedAvg CNN
(``cnn_fedavg``, about 1.7 M parameters; the paper's has 1,018,174) and SGD rates of our choosing
(client 0.02, batch 20; server 1.0). Needs TFF's ``fed_emnist_{train,test}.h5`` in ``data.data_dir``
(default ``$FEDJAX_DP_DATA/femnist``); ``data.source = femnist`` reads them when present."""

from fedjax_dp.data.local_files import default_data_dir as data_dir
from fedjax_dp.training.default_config import default_config


def get_config():
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = "dp_fedavg", 1500, 50
    c.data.update(
        source="femnist", data_dir=data_dir("femnist"), partition="natural", num_clients=3400
    )
    c.model.name = "cnn_fedavg"
    c.client.update(batch_size=20, epochs=1, learning_rate=0.02)
    c.sampling.update(method="poisson", rate=100 / 3400)
    c.dp.update(noise_mode="distributed", clip_norm=0.03)
    c.ddp.update(mechanism="ddgauss", bits=16, k_stddevs=4.0)
    c.privacy.update(accountant="rdp", target_epsilon=10.0, delta=1 / 3400)
    return c
