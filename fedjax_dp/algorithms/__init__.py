"""Federated algorithms, one module each; importing the package registers every one of them
(``algorithms.registry``)."""

from fedjax_dp.algorithms import dp_fedavg, dp_uga, fedavg, fedmeta, fedprox, scaffold, uga  # noqa: F401  (registration)

DEFAULT_ALGORITHM = "fedavg"
