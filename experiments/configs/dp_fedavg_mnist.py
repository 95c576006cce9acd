"""DP-FedAvg (Geyer et al. 2017) on the embedded MNIST subset: central Gaussian noise, fixed S,
fixed-size sampling of 10 of 100 clients, stop when epsilon at delta = 1e-5 would exceed 8."""

from fedjax_dp.training.default_config import default_config


def get_config():
    c = default_config()
    c.algorithm = "dp_fedavg"
    c.rounds = 100
    c.dp.noise_multiplier = 1.0
    c.dp.clip_norm = 1.0
    c.dp.max_epsilon = 8.0
    return c
