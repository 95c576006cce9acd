"""Federated algorithms, one module each; importing the package registers every one of them by name
(``registry.names()``; ``registry.register`` adds your own, see ``core.algorithm.Algorithm``)."""

from fedjax_dp.algorithms import (cuag_pfl, dp_fedavg, dp_uga, fedavg, fedmeta, fedprox, ldp_minibatch,  # noqa: F401
                                  pfldyn_proto, registry, scaffold, uga)  # (registration)
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.algorithms.fedprox import FedProx
from fedjax_dp.algorithms.scaffold import Scaffold
from fedjax_dp.algorithms.uga import UGA, make_uga_gradient

DEFAULT_ALGORITHM = "fedavg"

__all__ = ["registry", "FedAvg", "FedProx", "Scaffold", "UGA", "make_uga_gradient", "DEFAULT_ALGORITHM"]
