"""Your modules, which register models and data sources (and algorithms) with the package's
registries: imported by name or path (``fedjax-dp --import my_module``), or declared by an
installed package under the ``fedjax_dp.plugins`` entry-point group, which ``Experiment`` and the
command load before they check a config::

    # your package's setup.cfg
    [options.entry_points]
    fedjax_dp.plugins =
        my_models = my_package.fedjax_models

An entry point names a module (imported: its top level registers) or a function of no arguments
(imported and called).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys

GROUP = "fedjax_dp.plugins"

_LOADED: list[str] = []  # the entry points loaded in this process


def import_module(spec: str):
    """Imports ``spec``, a module name (found from the current folder too, as ``python -m`` does)
    or a ``.py`` file's path; a failure raises ``ValueError`` in one line naming it."""
    try:
        if spec.endswith(".py") or os.sep in spec:
            name = os.path.splitext(os.path.basename(spec))[0]
            module_spec = importlib.util.spec_from_file_location(name, spec)
            if module_spec is None or not os.path.exists(spec):
                raise FileNotFoundError(f"no such file {spec!r}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
            return module
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.append(os.getcwd())
        return importlib.import_module(spec)
    except Exception as error:  # noqa: BLE001  (whatever the user's module raises: one line)
        raise ValueError(f"--import {spec}: {_line(error)}") from None


def load_entry_points() -> tuple[str, ...]:
    """Loads every ``fedjax_dp.plugins`` entry point not loaded yet; returns the names loaded so
    far. A failure raises ``ValueError`` in one line naming the entry point."""
    for point in importlib.metadata.entry_points(group=GROUP):
        if point.name in _LOADED:
            continue
        _LOADED.append(point.name)
        try:
            loaded = point.load()
            if callable(loaded) and not isinstance(loaded, type(sys)):
                loaded()
        except Exception as error:  # noqa: BLE001  (one line naming the plugin)
            raise ValueError(
                f"plugin {point.name} = {point.value} (entry point group {GROUP}): {_line(error)}"
            ) from None
    return tuple(_LOADED)


def _line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:600]
