"""Checks every run of an experiment script before the first one loads data: a bad argument or setting
late in a grid must not surface after hours of runs (the brief: bad input gets a clear error naming the
key and the value, before any data is loaded)."""

from __future__ import annotations

import argparse
from typing import Callable, Iterable

from fedjax_dp.training.config_validation import validate_config


def check_runs(parser: argparse.ArgumentParser, plan: Callable[[], Iterable[tuple[str, object]]]) -> None:
    """Builds the ``(run name, config)`` pairs ``plan`` yields and validates each; the first problem (from
    building or validating) exits through ``parser.error`` with the run's name, nothing having run."""
    name = "planning the runs"
    try:
        for name, cfg in plan():
            validate_config(cfg)
    except ValueError as error:
        parser.error(f"{name}: {error}")
