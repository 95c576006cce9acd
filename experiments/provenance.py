"""Where a raw row came from: the command, the commit (and whether the tree was dirty), the date and
the machine, recorded beside every experiment's rows so that a number in ``RESULTS.md`` can be
traced to how it was made."""

from __future__ import annotations

import datetime
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


def provenance() -> dict:
    """The command line, commit, dirty flag, UTC date and machine (CPU model, core count,
    accelerator) of this run."""
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
    }
