"""Federated algorithms, one module each; importing the package imports every module in it, which
registers each algorithm by name (``registry.names()``): a new algorithm is its module and its test,
nothing else (``registry.register`` adds your own from anywhere, see
``core.algorithm.Algorithm``)."""

import importlib
import pkgutil

from fedjax_dp.algorithms import registry

# registration, in a fixed order
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

from fedjax_dp.algorithms.fedavg import FedAvg  # noqa: E402
from fedjax_dp.algorithms.fedprox import FedProx  # noqa: E402
from fedjax_dp.algorithms.scaffold import Scaffold  # noqa: E402
from fedjax_dp.algorithms.uga import UGA, make_uga_gradient  # noqa: E402

DEFAULT_ALGORITHM = "fedavg"

__all__ = [
    "registry",
    "FedAvg",
    "FedProx",
    "Scaffold",
    "UGA",
    "make_uga_gradient",
    "DEFAULT_ALGORITHM",
]
