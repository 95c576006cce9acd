"""What a run says while it runs, besides the progress bar: the noise and the epsilon it will spend
(``say``), and where there is no bar (a log file), one line for each slow phase (checking the config
and calibrating the noise, loading the data, compiling: ``phase``) and one per evaluation (round,
metrics, epsilon). On a terminal the privacy line is the first the run prints.

A progress bar only makes sense on a terminal: written to a log file it is a hundred ``\\r``
frames. ``progress_mode`` picks the bar on a terminal and plain lines elsewhere (or when asked, the
command's ``--noprogress``). The lines go through the ``fedjax_dp.run`` logger, so a program that
embeds a run can route them like any other log.
"""

from __future__ import annotations

import contextlib
import logging
import sys

LOGGER = logging.getLogger("fedjax_dp.run")

MODES = ("bar", "lines", "off")


def progress_mode(progress) -> str:
    """``"bar"``, ``"lines"`` or ``"off"`` for ``progress``: True is the bar where stderr is a
    terminal and lines elsewhere; False is nothing; a mode's name is that mode."""
    if progress in MODES:
        return progress
    if progress is True:
        return "bar" if _is_terminal(sys.stderr) else "lines"
    if progress is False or progress is None:
        return "off"
    raise ValueError(f"progress must be True, False or one of {MODES}, got {progress!r}")


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


PHASE = logging.INFO - 1  # a slow phase's line: shown with the lines, not beside the bar


def say(text: str) -> None:
    """One line on stderr, where the run shows its progress (``shown``)."""
    LOGGER.info(text)


def phase(text: str) -> None:
    """A slow phase's line, shown where there is no progress bar (``shown("lines")``)."""
    LOGGER.log(PHASE, text)


class _Lines(logging.StreamHandler):
    """The handler ``shown`` installs: the message alone, on the stderr of the moment."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record):
        self.setStream(sys.stderr)  # pytest and notebooks replace sys.stderr
        super().emit(record)


@contextlib.contextmanager
def shown(mode: str):
    """Within, ``say`` prints its lines, and with ``mode="lines"`` ``phase`` too (the outermost
    call decides); nothing with ``"off"``."""
    if mode == "off" or any(isinstance(h, _Lines) for h in LOGGER.handlers):
        yield
        return
    handler, level, propagate = _Lines(), LOGGER.level, LOGGER.propagate
    LOGGER.addHandler(handler)
    LOGGER.setLevel(PHASE if mode == "lines" else logging.INFO)
    LOGGER.propagate = False
    try:
        yield
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)
        LOGGER.propagate = propagate
