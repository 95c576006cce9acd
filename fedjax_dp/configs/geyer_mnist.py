"""Geyer et al. 2017 Table 1: DP-FedAvg on real MNIST with K = 100 / 1000 / 10000 clients
(geyer_mnist:K[:poisson]).

Geyer et al. 2017, Table 1: DP-FedAvg on real MNIST, non-IID (2 label-sorted shards per client).

``--config=geyer_mnist:K`` with K in {100, 1000, 10000} picks the authors'
code settings: m = 30 / 100 / 300 clients per round, sigma = 1, Q = 1e-3 / 1e-5 / 1e-6 at epsilon =
8, MLP 784-600-100-10. Local training: E = 1 epoch of batch 10, lr 0.1 (our choice; the paper does
not state it). Clipping: private adaptive quantile clipping at the median (Andrew et al. 2021), the
sound analogue of the paper's median S (``--config.dp.clip=median`` runs the paper's non-private
rule).
Sampling: exactly m clients (as the authors' code does), accounted correctly as replace-one with
RDP; ``--config=geyer_mnist:K:poisson`` gives the Poisson variant (each client with probability
q = m/K, add/remove-one, PLD).
The MNIST files are read from ``data.data_dir`` (default ``$FEDJAX_DP_DATA/mnist``).
"""

from fedjax_dp.data.local_files import default_data_dir
from fedjax_dp.training.default_config import default_config

SETTINGS = {100: (30, 1e-3), 1000: (100, 1e-5), 10000: (300, 1e-6)}


def get_config(spec: str = "100"):
    """``spec``: "K" (exactly m clients a round) or "K:poisson" (probability m/K, PLD)."""
    clients, _, sampling = spec.partition(":")
    k = int(clients)
    if k not in SETTINGS:
        raise ValueError(f"K must be one of {sorted(SETTINGS)}, got {k}")
    if sampling not in ("", "poisson"):
        raise ValueError(
            f"only ':poisson' may follow K (geyer_mnist:K[:poisson]), got {sampling!r}"
        )
    m, q_budget = SETTINGS[k]
    c = default_config()
    c.algorithm = "dp_fedavg"
    c.rounds = 1000
    c.eval_every = 5
    c.data.source, c.data.data_dir = "mnist", default_data_dir("mnist")
    c.data.partition, c.data.num_clients, c.data.shards_per_client, c.data.test_fraction = (
        "shards",
        k,
        2,
        0.0,
    )
    c.model.name = "mlp_600_100"
    c.client.learning_rate, c.client.batch_size, c.client.epochs = 0.1, 10, 1
    if sampling == "poisson":
        c.sampling.method, c.sampling.rate, c.privacy.accountant = "poisson", m / k, "pld"
    else:
        c.sampling.method, c.sampling.cohort_size = "uniform", m
    c.dp.noise_multiplier, c.dp.clip, c.dp.clip_norm = 1.0, "adaptive", 1.0
    c.privacy.delta = q_budget
    c.privacy.stop_epsilon, c.privacy.stop_max_delta = 8.0, q_budget
    return c
