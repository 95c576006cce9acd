"""Federated algorithms, one module each; importing the package registers every one of them
(``algorithms.registry``)."""

from fedjax_dp.algorithms import (cuag_pfl, dp_fedavg, dp_uga, fedavg, fedmeta, fedprox, ldp_minibatch, pfldyn_proto,  # noqa: F401
                                  scaffold, uga)  # (registration)

DEFAULT_ALGORITHM = "fedavg"
