"""Federated algorithms, one module each; importing the package registers every one of them
(``algorithms.registry``)."""

from fedjax_dp.algorithms import (dp_fedavg, dp_uga, fedavg, fedmeta, fedprox, ldp_minibatch, scaffold,  # noqa: F401
                                  uga)  # (registration)

DEFAULT_ALGORITHM = "fedavg"
