"""fedjax_dp: simulation of differentially-private federated learning in JAX.

The one obvious path::

    import fedjax_dp
    summary = fedjax_dp.Experiment("dp_fedavg_mnist", {"rounds": 20}).run("results/dp")

A sweep whose selection of the best run pays its privacy cost (``fedjax_dp.sweep``,
``docs/sweeps.md``)::

    fedjax_dp.sweep("dp_fedavg_mnist", {"dp.clip_norm": [0.5, 1.0]}, workdir="results/sweep")

Your own model and federated data: ``register_model`` / ``register_data`` (or ``Experiment(...,
model=..., data=...)``); see ``docs/your_model_and_data.md``.

``fedjax_dp.configs`` lists the shipped configs; ``fedjax_dp.default_config()`` has every key. The
building blocks, to compose by hand: ``core`` (the ``Algorithm`` protocol, ``FederatedRound``,
upload ``chain``s), ``privacy`` (upload transforms that declare their DP releases, samplers that
carry their own accounting, accountants on dp_accounting), ``algorithms`` (the registry and every
algorithm), ``compression``, ``data``, ``models``, ``training``.

Layout (dependencies point down): ``core`` <- ``privacy``, ``compression`` <- ``algorithms``;
``models``; ``data`` <- ``training`` <- ``experiment``.

Importing the package changes no JAX setting. ``Experiment`` and the ``fedjax-dp`` command ask for
one CPU device per core (``use_a_device_per_core``, ``core.host_devices``) before they run; a script
that builds rounds by hand calls ``fedjax_dp.use_a_device_per_core()`` itself, before its first JAX
computation.
"""

__version__ = "0.2.0"

from fedjax_dp import algorithms, compression, configs, core, data, models, privacy, training
from fedjax_dp.core.host_devices import use_a_device_per_core
from fedjax_dp.data.sources import register_data
from fedjax_dp.experiment import Experiment, RunSummary, SeedsSummary
from fedjax_dp.sweeps import SweepSummary, sweep

# ModelFunctions: a shortcut for fedjax_dp.models.ModelFunctions (documented there)
from fedjax_dp.models import ModelFunctions, register_model  # noqa: F401
from fedjax_dp.training.default_config import default_config

__all__ = [
    "Experiment",
    "RunSummary",
    "SeedsSummary",
    "sweep",
    "SweepSummary",
    "default_config",
    "register_model",
    "register_data",
    "configs",
    "algorithms",
    "compression",
    "core",
    "data",
    "models",
    "privacy",
    "training",
    "use_a_device_per_core",
    "__version__",
]
