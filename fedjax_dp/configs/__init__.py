"""The shipped experiment configs, by name: ``fedjax-dp --config fedavg_mnist`` or, from Python,
``fedjax_dp.configs.get("dp_fedavg_mnist")``. Each module here defines ``get_config()`` (some take
an
argument: ``geyer_mnist:1000``) starting from ``training.default_config.default_config()``.

Configs come back locked (``ml_collections``): assigning a key that does not exist raises at once,
naming the closest existing key, so a typo such as ``c.dp.noise_multipler = 3.0`` can never be
ignored.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import pkgutil

import ml_collections

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT = "fedavg_mnist"


def names() -> tuple[str, ...]:
    """The shipped configs' names, sorted."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules([PACKAGE_DIR])))


def summary(name: str) -> str:
    """The first line of a config's docstring (what ``fedjax-dp --help`` lists)."""
    return (_module(name).__doc__ or "").strip().split("\n")[0]


def path(name: str) -> str:
    """The file of a shipped config (for ``ml_collections.config_flags``)."""
    _check_name(name)
    return os.path.join(PACKAGE_DIR, f"{name}.py")


def resolve(spec: str) -> str:
    """A ``--config`` value as a file path: an existing path stays as it is; a shipped name
    (optionally ``name:argument``) becomes its file in this package."""
    file, _, argument = spec.partition(":")
    if os.path.exists(file) or file.endswith(".py") or os.sep in file:
        return spec
    return path(file) + (f":{argument}" if argument else "")


def get(spec: str = DEFAULT, overrides: dict | None = None) -> ml_collections.ConfigDict:
    """A locked config by name (``"geyer_mnist:1000"`` passes ``"1000"`` to ``get_config``) or by
    path to a config file, with ``overrides`` ({"dp.noise_multiplier": 1.0, ...}) applied; an
    unknown override key raises ``KeyError`` naming the closest existing key."""
    file, _, argument = resolve(spec).partition(":")
    module = _load_file(file)
    cfg = module.get_config(argument) if argument else module.get_config()
    cfg.lock()  # (a config built without default_config() is locked here too)
    for key, value in (overrides or {}).items():
        set_value(cfg, key, value)
    return cfg


def set_value(cfg: ml_collections.ConfigDict, dotted: str, value) -> None:
    """``cfg.a.b = value`` for ``dotted`` = "a.b"; an unknown key raises ``KeyError`` with the
    closest."""
    parts, node = dotted.split("."), cfg
    for depth, part in enumerate(parts):
        if not hasattr(node, "keys") or part not in node:
            raise KeyError(unknown_key_message(".".join(parts[: depth + 1]), cfg))
        if depth < len(parts) - 1:
            node = node[part]
    current = node[parts[-1]]
    if isinstance(current, str) and isinstance(value, (int, float)) and not isinstance(value, bool):
        # a text key that takes numbers too ("0.5" rates, "4" thresholds, "0.45" sigma)
        value = str(value)
    try:
        node[parts[-1]] = value
    except TypeError:
        raise ValueError(
            f"config key {dotted!r} expects {type(current).__name__} (default {current!r}), "
            f"got {value!r}"
        ) from None


def all_keys(cfg, prefix: str = "") -> list[str]:
    """Every leaf key of ``cfg`` as a dotted path."""
    keys = []
    for key in cfg.keys():
        if hasattr(cfg[key], "keys"):
            keys += all_keys(cfg[key], f"{prefix}{key}.")
        else:
            keys.append(prefix + key)
    return keys


def unknown_key_message(dotted: str, cfg) -> str:
    """ "unknown config key X; did you mean Y?" (Y: the closest dotted key of ``cfg``), or for a key
    that moved to the privacy section, its new name."""
    from fedjax_dp.privacy.settings import moved_message

    moved = moved_message(dotted)
    if moved:
        return moved
    close = difflib.get_close_matches(dotted, all_keys(cfg), n=1, cutoff=0.6)
    return f"unknown config key {dotted!r}" + (
        f"; did you mean {close[0]!r}?" if close else "; `fedjax-dp --help` lists the keys"
    )


def _check_name(name: str) -> None:
    if name not in names():
        close = difflib.get_close_matches(name, names(), n=1)
        raise ValueError(
            f"unknown config {name!r}"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + f"; shipped configs: {', '.join(names())} (or give a path to a config file)"
        )


def _module(name: str):
    _check_name(name)
    return importlib.import_module(f"{__name__}.{name}")


def _load_file(file: str):
    if not os.path.exists(file):
        raise FileNotFoundError(
            f"config file {file!r} not found; shipped configs: {', '.join(names())}"
        )
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(file))[0], file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
