"""What ``fedjax-dp-launch`` shows of its processes' output: their own lines, not the runtime's.

When one process of a run dies, the others' C++ runtime (XLA's coordination service, gloo) writes
glog records, multi-line messages and a stack trace of a dozen frames to stderr: 25 lines around the
one that says what happened (``fedjax-dp-launch: the run failed: process 1 was the first to stop``).
``RuntimeOutput`` sorts each stderr line: a glog record (``E1207 05:30:12.401975 20454 file.cc:1549]
...``) and the lines that continue it, gloo's own lines, and everything after a fatal record (the
stack trace of an aborting process) go to a log file; every other line goes to the terminal. The
log file (``launch.log`` in the run's workdir, or in the current folder) is written only once a
record worth keeping arrives, so a clean run leaves none; the terminal then gets one line naming it.
"""

from __future__ import annotations

import os
import re
import threading

GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\]")
GLOO = "[Gloo]"
# a line of ours (or of a user's program) that ends a glog record's continuation lines
OURS = re.compile(
    r"^(error|warning|WARNING|ERROR|Traceback|interrupted|fedjax-dp-launch|round \d+/|privacy: "
    r"|checking the config|loading data|compiling)"
)
LOG_FILE = "launch.log"


class RuntimeOutput:
    """The launcher's log of the runtime's lines, shared by the threads that forward each
    process's stderr (``is_runtime`` sorts one stream's lines; ``keep`` writes one)."""

    def __init__(self, path: str):
        self.path, self.lines, self._buffer, self._lock = path, 0, [], threading.Lock()

    def keep(self, line: str, serious: bool) -> None:
        """Writes ``line`` to the log, opened at the first ``serious`` line (until then the lines
        wait in memory: gloo's connection lines alone do not make a log)."""
        with self._lock:
            self.lines += 1
            self._buffer.append(line)
            if not serious and not os.path.exists(self.path):
                return
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "a") as f:
                f.writelines(self._buffer)
            self._buffer = []

    def written(self) -> bool:
        return os.path.exists(self.path)


class StreamSorter:
    """One process's stderr, line by line: ``sort(line)`` is None for a line to show, or whether
    the runtime's line is serious (a glog record above INFO, or part of one)."""

    def __init__(self):
        self.in_record, self.fatal = False, False

    def sort(self, line: str) -> bool | None:
        if self.fatal:
            return True
        if GLOG.match(line):
            self.in_record, self.fatal = True, line.startswith("F")
            return not line.startswith("I")
        if line.startswith(GLOO):
            return False
        if self.in_record and not OURS.match(line):
            return True
        self.in_record = False
        return None


def log_path(rest: list[str]) -> str:
    """``launch.log`` in the run's ``--workdir`` (where ``rest`` names one), else here."""
    for index, arg in enumerate(rest):
        if arg.startswith("--workdir="):
            return os.path.join(arg.split("=", 1)[1], LOG_FILE)
        if arg == "--workdir" and index + 1 < len(rest):
            return os.path.join(rest[index + 1], LOG_FILE)
    return LOG_FILE


def forward(stream, prefix: str, out, runtime: RuntimeOutput) -> None:
    """Copies ``stream``'s lines to ``out`` (each after ``prefix``), the runtime's lines to
    ``runtime``'s log instead."""
    sorter = StreamSorter()
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        serious = sorter.sort(line)
        if serious is None:
            out.write(prefix + line)
            out.flush()
        else:
            runtime.keep(prefix + line, serious)
