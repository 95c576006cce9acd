"""One run per workdir at a time, held from the run's first step.

Two runs into one workdir interleaved their rows into an unparseable ``metrics.jsonl`` and both
crashed in orbax. ``WorkdirLock`` holds an exclusive ``fcntl`` lock on ``<workdir>/.fedjax_dp.lock``
for the run's lifetime (the kernel releases it when the process dies, even by ``kill -9``); the file
names its holder, so a second run fails at once with one line naming the process. The command takes
it before it validates the config or calibrates the noise (which may take a minute), so a second run
learns at once that the workdir is taken.

The lock is re-entrant within a process (the command holds it around ``Experiment.run``, which takes
it again). A workdir the lock had to create and that holds nothing else when it is released (a run
refused before it wrote anything: an invalid config, a ``--resume`` of a workdir that never ran) is
removed again, lock file and all. A workdir that cannot be a folder (an existing file) or cannot be
written is ``WorkdirUnusable``, one line naming the path and why.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time

from fedjax_dp.core import hosts

LOCK_FILE = ".fedjax_dp.lock"

_HELD: dict[str, int] = {}  # lock file path -> how many times this process entered it


class WorkdirInUse(RuntimeError):
    pass


class WorkdirUnusable(ValueError):
    """The workdir is a file, or a folder this process cannot create or write: ``reason`` says
    which."""

    def __init__(self, workdir: str, reason: str | None = None):
        if reason is None:  # rebuilt from its message (another process's: ``core.hosts``)
            workdir, _, reason = workdir.partition(": ")
        super().__init__(f"{workdir}: {reason}")
        self.workdir, self.reason = workdir, reason


class WorkdirLock:
    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path = os.path.join(workdir, LOCK_FILE)
        self._file = None
        self._created: list[str] = []  # folders this lock made, innermost first

    def __enter__(self) -> "WorkdirLock":
        key = os.path.abspath(self.path)
        if _HELD.get(key):
            _HELD[key] += 1
            return self
        self._created = _make_folders(self.workdir)
        while True:
            try:
                handle = open(self.path, "a+")
            except OSError as error:
                self._remove_created()
                raise WorkdirUnusable(
                    self.workdir, f"cannot write in it ({error.strerror})"
                ) from None
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip()
                handle.close()
                raise WorkdirInUse(
                    f"{self.workdir} is in use by another run ({_describe(holder)}); wait for it"
                    " to finish or choose another --workdir"
                ) from None
            # the file may have been removed by the run that held it just before: lock the one there
            if _same_file(handle, self.path):
                break
            handle.close()
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
        _HELD[key] = 1
        return self

    def __exit__(self, *exc) -> None:
        key = os.path.abspath(self.path)
        if _HELD.get(key, 0) > 1:
            _HELD[key] -= 1
            return
        _HELD.pop(key, None)
        if self._file is None:
            return
        # nothing was written beside the lock: the workdir is left as it was found
        with contextlib.suppress(OSError):
            if os.listdir(self.workdir) == [LOCK_FILE]:
                os.remove(self.path)
                self._remove_created()
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()
        self._file = None

    def _remove_created(self) -> None:
        for folder in self._created:
            with contextlib.suppress(OSError):
                os.rmdir(folder)


@contextlib.contextmanager
def held_by_process_zero(workdir: str):
    """``WorkdirLock(workdir)`` held by process 0 (the one that writes); every process learns
    whether it was free."""
    lock = WorkdirLock(workdir)
    hosts.on_primary(lock.__enter__)
    try:
        yield
    finally:
        if hosts.is_primary():
            lock.__exit__(None, None, None)


def _make_folders(workdir: str) -> list[str]:
    """Creates ``workdir`` and any missing parents; returns those it created, innermost first."""
    missing, folder = [], os.path.abspath(workdir)
    while not os.path.exists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise WorkdirUnusable(
            workdir,
            "it is a file, not a folder"
            if folder == os.path.abspath(workdir)
            else f"{folder} is a file, not a folder, so nothing can be created below it",
        )
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as error:
        raise WorkdirUnusable(workdir, f"cannot create it ({error.strerror})") from None
    return missing


def _same_file(handle, path: str) -> bool:
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _describe(holder: str) -> str:
    try:
        owner = json.loads(holder)
        return f"process {owner['pid']} on {owner['host']}, started {owner['started']}"
    except (ValueError, KeyError, TypeError):
        return "a process that did not say which"
