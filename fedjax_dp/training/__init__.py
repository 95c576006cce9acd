"""The experiment loop and what surrounds it: building a round from a config, validation,
evaluation, checkpoints, results files, plots, multi-seed summaries; ``Callback`` and ``StopWhen``
are the hooks a user adds to the loop (``Experiment.run(..., callbacks=[...])``)."""

from fedjax_dp.training.callbacks import Callback, StopWhen
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.evaluation import evaluate
from fedjax_dp.training.loop import run_experiment
from fedjax_dp.training.results import read_metrics

__all__ = [
    "validate_config",
    "default_config",
    "evaluate",
    "run_experiment",
    "read_metrics",
    "Callback",
    "StopWhen",
]
