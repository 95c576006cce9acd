"""Checks every run of an experiment script before the first one loads data: a bad argument or
setting late in a grid must not surface after hours of runs (the brief: bad input gets a clear error
naming the key and the value, before any data is loaded)."""

from __future__ import annotations

import argparse
from typing import Callable, Sequence

from fedjax_dp.training.config_validation import validate_config


def checked_runs(
    parser: argparse.ArgumentParser, plan: Callable[[], Sequence[tuple]]
) -> list[tuple]:
    """The runs ``plan()`` builds, each a tuple ``(name, config, ...)``, after validating every
    config; the first problem (from building or validating) exits through ``parser.error`` with the
    run's name, nothing having run."""
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


def apply_overrides(cfg, items) -> None:
    """``--set key=value`` items into ``cfg``, each value converted to the type of the value it
    replaces; a ValueError names an item without ``=``, a key the config lacks, or a value that does
    not convert."""
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: write key=value, e.g. client.learning_rate=0.05")
        key, value = item.split("=", 1)
        *sections, name = key.split(".")
        node = cfg
        try:
            for s in sections:
                node = node[s]
            old = node[name]
        except (KeyError, AttributeError, TypeError):
            raise ValueError(f"--set {item!r}: the config has no key {key!r}") from None
        try:
            node[name] = (
                type(old)(value)
                if not isinstance(old, bool)
                else value.lower() in ("1", "true", "yes")
            )
        except (TypeError, ValueError):
            raise ValueError(
                f"--set {item!r}: {key} takes a value of type {type(old).__name__}, got {value!r}"
            ) from None
