"""Checkpoint and resume of the experiment loop, and graceful interruption.

A checkpoint holds everything the next round depends on: the server state, the per-client states
(SCAFFOLD's c_i) and any other pytrees (orbax ``StandardCheckpointer``), and a JSON record of the host RNG state, the round number, counters,
the best accuracy so far, traffic totals and the participation history (which clients took part in
which round). The privacy accountant and per-client ledgers are rebuilt on resume by replaying that
history, so the privacy ledger is never reset and never counts a round twice. Metrics rows written
after the checkpoint (a run killed between checkpoints) are dropped on resume and recomputed.

Layout: ``<workdir>/checkpoints/round_000012/{state/, loop.json}``; a checkpoint is written under a
temporary name and renamed into place, so a half-written one is never read. The last ``keep`` are kept.
SIGINT / SIGTERM during a run finish the current round, write a checkpoint and stop the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading

import orbax.checkpoint as ocp

PREFIX = "round_"


class Checkpointer:
    def __init__(self, directory: str, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 checkpoints, got {keep}")
        self.directory, self.keep = directory, keep
        self._orbax = ocp.StandardCheckpointer()

    def rounds(self) -> list[int]:
        if not os.path.isdir(self.directory):
            return []
        return sorted(int(name[len(PREFIX):]) for name in os.listdir(self.directory)
                      if name.startswith(PREFIX) and name[len(PREFIX):].isdigit()
                      and os.path.exists(os.path.join(self.directory, name, "loop.json")))

    def _path(self, round_index: int) -> str:
        return os.path.join(self.directory, f"{PREFIX}{round_index:06d}")

    def save(self, round_index: int, trees: dict, loop_state: dict) -> str:
        final = self._path(round_index)
        if os.path.exists(final):
            return final
        temporary = final + ".tmp"
        shutil.rmtree(temporary, ignore_errors=True)
        os.makedirs(temporary)
        self._orbax.save(os.path.join(os.path.abspath(temporary), "state"), trees)
        self._orbax.wait_until_finished()
        with open(os.path.join(temporary, "loop.json"), "w") as f:
            json.dump({**loop_state, "round": round_index}, f)
        os.replace(temporary, final)
        for old in self.rounds()[:-self.keep]:
            shutil.rmtree(self._path(old), ignore_errors=True)
        return final

    def restore_latest(self, target_trees):
        """``(trees, loop_state)`` of the newest complete checkpoint, or None when there is none.
        ``target_trees`` is the dict of restore targets, or a function of the saved loop state that
        returns it (when the shapes depend on what was saved, e.g. how many clients hold a state)."""
        rounds = self.rounds()
        if not rounds:
            return None
        path = self._path(rounds[-1])
        with open(os.path.join(path, "loop.json")) as f:
            loop_state = json.load(f)
        target = target_trees(loop_state) if callable(target_trees) else target_trees
        return self._orbax.restore(os.path.join(os.path.abspath(path), "state"), target), loop_state


def truncate_metrics(metrics_path: str, last_round: int) -> None:
    """Drops rows of rounds after ``last_round`` (written after the checkpoint a resume starts from),
    and a last line torn by a kill in mid-write (every complete row is one JSON object)."""
    with open(metrics_path) as f:
        lines = [line for line in f if line.strip()]
    rows = []
    for k, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if k == len(lines) - 1:
                break  # the torn last write of a killed run: recomputed after the resume
            raise ValueError(f"{metrics_path}: line {k + 1} is not a JSON row (and not the last): {line[:80]!r}")
        if row["round"] <= last_round:
            rows.append(line if line.endswith("\n") else line + "\n")
    temporary = metrics_path + ".tmp"
    with open(temporary, "w") as f:
        f.writelines(rows)
    os.replace(temporary, metrics_path)


class Interruption:
    """Set by SIGINT / SIGTERM while installed; the loop checks it after each round."""

    def __init__(self):
        self.event = threading.Event()
        self.signal_name = None

    def __bool__(self) -> bool:
        return self.event.is_set()

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self  # signal handlers can only be installed from the main thread
            return
        def handler(signum, frame):
            self.signal_name = signal.Signals(signum).name
            self.event.set()
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
