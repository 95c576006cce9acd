"""A persistent XLA compilation cache for the ``fedjax-dp`` command and the experiment scripts.

Every run is a fresh process that compiles its programs again: the round, the evaluation, the local
steps (unrolled CNN clients compile in time linear in their steps). JAX can keep compiled
executables on disk, keyed by the program's HLO, the compile options, the backend and the jaxlib
version, and load them instead of compiling (``jax_compilation_cache_dir``; the same executable, so
the same numbers bit for bit). The command turns it on in ``FEDJAX_DP_COMPILATION_CACHE`` (default
``$XDG_CACHE_HOME/fedjax_dp/xla``, else ``~/.cache/fedjax_dp/xla``; ``off`` to disable), capped at
``MAX_BYTES`` with JAX's least-recently-used eviction (under a file lock: concurrent runs may share
the folder). A choice already made stands (``JAX_COMPILATION_CACHE_DIR`` or
``jax_compilation_cache_dir``). Seeds of one config and the cells of a table that differ only in
data share their programs, so the cache helps within one process too.

What it saves is measured by ``benchmarks/compilation_cache.py``.
"""

from __future__ import annotations

import logging
import os

import jax

ENV = "FEDJAX_DP_COMPILATION_CACHE"
# least-recently-used entries are evicted past this (a CUAG-PFL run writes ~2 MB)
MAX_BYTES = 2 * 2**30


def default_folder() -> str:
    """``$XDG_CACHE_HOME/fedjax_dp/xla``, or ``~/.cache/fedjax_dp/xla`` where XDG_CACHE_HOME is
    unset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fedjax_dp", "xla")


def use_persistent_cache() -> str | None:
    """Points JAX's persistent compilation cache at ``FEDJAX_DP_COMPILATION_CACHE`` (module
    docstring) and returns that folder; None where it is ``off``, where a cache folder was already
    chosen, or where the folder cannot be written (logged; the run compiles as usual). Call it
    before JAX compiles anything: JAX reads the setting once, at its first compilation."""
    folder = os.environ.get(ENV, "").strip() or default_folder()
    if folder.lower() == "off" or jax.config.jax_compilation_cache_dir:
        return None
    try:
        os.makedirs(folder, exist_ok=True)
        writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError as error:
        writable, folder = False, f"{folder} ({error.strerror})"
    if not writable:
        logging.warning(
            "compilation cache: %s is not a writable folder; compiling without a cache (set %s to "
            "another folder, or to 'off')",
            folder,
            ENV,
        )
        return None
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return folder
