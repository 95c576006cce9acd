"""Federated algorithms, one module each; importing the package registers every one of them by name
(``registry.names()``; ``registry.register`` adds your own, see ``core.algorithm.Algorithm``)."""

from fedjax_dp.algorithms import (cuag_pfl, dp_fedavg, dp_scaffold, dp_uga, fedavg, fedmeta, fedprox,  # noqa: F401
                                  ldp_minibatch, pfldyn_proto, prifedsync, registry, scaffold, udp, uga)  # (registration)
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.algorithms.fedprox import FedProx
from fedjax_dp.algorithms.scaffold import Scaffold
from fedjax_dp.algorithms.uga import UGA, make_uga_gradient

DEFAULT_ALGORITHM = "fedavg"

__all__ = ["registry", "FedAvg", "FedProx", "Scaffold", "UGA", "make_uga_gradient", "DEFAULT_ALGORITHM"]
