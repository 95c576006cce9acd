"""Where a raw row came from: the command, the commit (and whether the tree was dirty), the date,
the machine and the versions of the libraries a number depends on, recorded beside every
experiment's rows so that a number in ``RESULTS.md`` can be traced to how it was made."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys


def _git(*args) -> str | None:
    try:
        return subprocess.run(
            ["git", *args],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


LIBRARIES = ("jax", "jaxlib", "flax", "optax", "dp-accounting", "jax-privacy", "numpy")
"""The distributions whose versions every raw row records (numbers and epsilons depend on them)."""


def library_versions(names=LIBRARIES) -> dict:
    """``{distribution: version}`` from the installed metadata (``importlib.metadata``), plus
    Python's; None for one that is not installed."""
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def stamped(record: dict) -> dict:
    """``record`` with this run's ``provenance()`` under ``"provenance"`` (first, so a reader sees
    it at the top of the file)."""
    return {"provenance": provenance(), **record}


def write_provenance(folder: str) -> str:
    """Writes ``provenance()`` to ``folder/provenance.json`` (for a script whose rows file is a bare
    list that readers depend on); returns the path."""
    import json

    path = os.path.join(folder, "provenance.json")
    with open(path, "w") as f:
        json.dump(provenance(), f, indent=1)
    return path


def provenance() -> dict:
    """The command line, commit, dirty flag, UTC date, machine (CPU model, core count,
    accelerator) and library versions (``library_versions``) of this run."""
    import jax

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu
            )
    except OSError:
        pass
    return {
        "command": " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable), *sys.argv]),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": f"{cpu}, {os.cpu_count()} cores, {jax.default_backend()}",
        "versions": library_versions(),
    }
