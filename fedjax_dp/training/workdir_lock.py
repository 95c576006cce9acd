"""One run per workdir at a time.

Two runs into one workdir interleaved their rows into an unparseable ``metrics.jsonl`` and both
crashed in orbax. ``WorkdirLock`` holds an exclusive ``fcntl`` lock on ``<workdir>/.fedjax_dp.lock``
for the run's lifetime (the kernel releases it when the process dies, even by ``kill -9``); the file
names its holder, so a second run fails at once with one line naming the process.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

LOCK_FILE = ".fedjax_dp.lock"


class WorkdirInUse(RuntimeError):
    pass


class WorkdirLock:
    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, LOCK_FILE)
        self._file = None

    def __enter__(self) -> "WorkdirLock":
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            raise WorkdirInUse(
                f"{os.path.dirname(self.path)} is in use by another run ({_describe(holder)}); wait"
                " for it to finish or choose another --workdir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                }
            )
        )
        handle.flush()
        self._file = handle
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def _describe(holder: str) -> str:
    try:
        owner = json.loads(holder)
        return f"process {owner['pid']} on {owner['host']}, started {owner['started']}"
    except (ValueError, KeyError, TypeError):
        return "a process that did not say which"
