"""A quiet console by default: library INFO logs (orbax's ~36 lines per checkpoint save) and
dp_accounting's convergence warnings during calibration are hidden unless ``verbose``; our own
warnings (dropped clients, refusals) still show."""

from __future__ import annotations

import contextlib
import logging

from absl import logging as absl_logging

LIBRARY_LOGGERS = ("absl", "orbax", "jax._src.xla_bridge", "tensorflow")


@contextlib.contextmanager
def quiet_console(verbose: bool = False):
    """Within: absl and library loggers at ERROR (WARNING and INFO shown with ``verbose``)."""
    saved_absl = absl_logging.get_verbosity()
    saved = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
    level = logging.INFO if verbose else logging.ERROR
    absl_logging.set_verbosity(absl_logging.INFO if verbose else absl_logging.ERROR)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        absl_logging.set_verbosity(saved_absl)
        for name, old in saved.items():
            logging.getLogger(name).setLevel(old)
