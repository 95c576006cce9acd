"""Checks every run of an experiment script before the first one loads data: a bad argument or setting
late in a grid must not surface after hours of runs (the brief: bad input gets a clear error naming the
key and the value, before any data is loaded)."""

from __future__ import annotations

import argparse
from typing import Callable, Sequence

from fedjax_dp.training.config_validation import validate_config


def checked_runs(parser: argparse.ArgumentParser, plan: Callable[[], Sequence[tuple]]) -> list[tuple]:
    """The runs ``plan()`` builds, each a tuple ``(name, config, ...)``, after validating every config; the
    first problem (from building or validating) exits through ``parser.error`` with the run's name,
    nothing having run."""
    try:
        runs = list(plan())
    except ValueError as error:
        parser.error(f"planning the runs: {error}")
    for name, cfg, *_ in runs:
        try:
            validate_config(cfg)
        except ValueError as error:
            parser.error(f"{name}: {error}")
    return runs
