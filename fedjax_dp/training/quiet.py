"""A quiet console by default: library logs (orbax's ~36 INFO lines per checkpoint save, its ERROR
lines by the hundred for a full disk or damaged checkpoints, dp_accounting's convergence warnings
during calibration) are kept out of the terminal, which gets our own one line; with a ``log_file``
their warnings and errors are written there instead (the run's ``library.log`` in its workdir, added
to by every run there), for whoever needs the detail. ``verbose`` shows them, INFO included, on the
console as before."""

from __future__ import annotations

import contextlib
import logging

from absl import logging as absl_logging

LIBRARY_LOGGERS = ("absl", "orbax", "jax._src.xla_bridge", "tensorflow", "asyncio")
LOG_FILE = "library.log"  # in a run's workdir


class _QuietFileHandler(logging.FileHandler):
    """A log file that never adds to the console: a disk that refuses it (full, read-only) is
    ignored here, and reported by the results it also refuses."""

    def handleError(self, record) -> None:
        pass


@contextlib.contextmanager
def quiet_console(verbose: bool = False, log_file: str | None = None):
    """Within: library loggers off the console (WARNING and above into ``log_file`` where given);
    with ``verbose`` at INFO on the console."""
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    saved_absl = absl_logging.get_verbosity()
    saved = [(lg, lg.level, lg.propagate) for lg in loggers]
    handler = None
    if verbose:
        absl_logging.set_verbosity(absl_logging.INFO)
        for lg in loggers:
            lg.setLevel(logging.INFO)
    else:
        absl_logging.set_verbosity(absl_logging.WARNING if log_file else absl_logging.ERROR)
        if log_file:
            handler = _QuietFileHandler(log_file, delay=True)
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
            )
        for lg in loggers:
            lg.setLevel(logging.WARNING if log_file else logging.CRITICAL + 1)
            lg.propagate = False
            if handler is not None:
                lg.addHandler(handler)
    try:
        yield
    finally:
        absl_logging.set_verbosity(saved_absl)
        for lg, level, propagate in saved:
            lg.setLevel(level)
            lg.propagate = propagate
            if handler is not None:
                lg.removeHandler(handler)
        if handler is not None:
            handler.close()
