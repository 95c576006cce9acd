"""Checkpoint and resume of the experiment loop, and graceful interruption.

A checkpoint holds everything the next round depends on: the server state, the per-client states
(control variates, say) and any other pytrees (item ``state``), and a JSON record (item ``loop``) of
the host RNG state, the round number, counters, the best accuracy so far, traffic totals, the
participation history (which clients took part in which round), the run's resolved config and what
its privacy tracker had composed (``run_state``). On resume the config must be the checkpoint's and
the replayed history must compose exactly what the checkpoint says ran, or the resume is refused:
the past is never re-accounted at today's noise. Metrics rows written after the checkpoint (a run
killed between checkpoints) are dropped on resume and recomputed.

A save onto a round that already has a checkpoint is an error (it would be another run's:
``--overwrite`` removes an earlier run's checkpoints first). Resume reads the newest checkpoint that
is intact: a newer one that cannot be read is named in a one-line warning and set aside
(``checkpoints/damaged``).

Storage is orbax's ``CheckpointManager``: ``<workdir>/checkpoints/round_000012/{state, loop}``,
written under a temporary name and renamed into place when complete (a half-written checkpoint is
never read), the last ``keep`` kept (config ``checkpoint_keep``; all of them with 0). Under several
processes (``core.hosts``) the state is the same on every host, so process 0 alone writes it
(orbax's multiprocessing options name it the only active process) and reads it on resume, and gives
every process what it read: the hosts need no shared filesystem. Every process learns whether a save
or a restore failed. SIGINT / SIGTERM during a run finish the current round, write a checkpoint and
stop the run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import signal
import threading

import jax
import numpy as np
import orbax.checkpoint as ocp

from fedjax_dp.core import hosts
from fedjax_dp.training.results import DISK_ERRORS, ResultsWriteError, free_space

DISK_WORDS = ("No space left", "Read-only file system", "Disk quota exceeded", "Permission denied")

PREFIX = "round"
DAMAGED = "damaged"  # where resume sets aside checkpoints it cannot read


class Checkpointer:
    """The loop's checkpoints: ``save(round, trees, loop_state)``, ``restore_latest(target)``."""

    def __init__(self, directory: str, keep: int | None = 2):
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1 checkpoints (None: every one), got {keep}")
        self.directory, self.keep = os.path.abspath(directory), keep
        alone = (
            ocp.options.MultiprocessingOptions(primary_host=0, active_processes={0})
            if hosts.distributed()
            else ocp.options.MultiprocessingOptions()
        )
        self._options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=not hosts.distributed(),
            enable_async_checkpointing=False,
            # several processes: process 0 creates the folder itself (_save)
            multiprocessing_options=alone,
            step_name_format=ocp.step.standard_name_format(
                step_prefix=PREFIX, step_format_fixed_length=6
            ),
        )

    @contextlib.contextmanager
    def _manager(self):  # opened for each use: the directory may have changed since (a resume)
        manager = ocp.CheckpointManager(self.directory, options=self._options)
        try:
            yield manager
        finally:
            manager.close()

    def rounds(self) -> list[int]:
        """The rounds with a checkpoint (process 0's, on every process)."""
        return hosts.on_primary(self._rounds, share=True)

    def _rounds(self) -> list[int]:
        if not os.path.isdir(self.directory):
            return []
        with self._manager() as manager:
            return sorted(manager.all_steps())

    def path(self, round_index: int) -> str:
        return os.path.join(self.directory, f"{PREFIX}_{round_index:06d}")

    def save(self, round_index: int, trees: dict, loop_state: dict) -> str:
        """Writes round ``round_index``'s checkpoint (on process 0; every process learns the
        outcome)."""
        return hosts.on_primary(self._save, round_index, trees, loop_state, share=True)

    def _save(self, round_index: int, trees: dict, loop_state: dict) -> str:
        # orbax refuses one process's device arrays under several processes: host copies
        if hosts.distributed():
            os.makedirs(self.directory, exist_ok=True)
            trees = jax.tree_util.tree_map(
                lambda x: (
                    x
                    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)
                    else np.asarray(x)
                ),
                trees,
            )
        with self._manager() as manager:
            if round_index in manager.all_steps():
                raise FileExistsError(
                    f"{self.path(round_index)} exists: it is another run's checkpoint (pass "
                    "--overwrite to replace that run, or --resume to continue it)"
                )
            try:
                manager.save(
                    round_index,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardSave(trees),
                        loop=ocp.args.JsonSave({**loop_state, "round": round_index}),
                    ),
                )
                manager.wait_until_finished()
            except Exception as error:  # noqa: BLE001  (orbax and TensorStore wrap the disk's refusal)
                code = getattr(error, "errno", None)
                if code in DISK_ERRORS or any(words in str(error) for words in DISK_WORDS):
                    raise ResultsWriteError(
                        code or errno.ENOSPC,
                        f"cannot write the checkpoint {self.path(round_index)}: "
                        f"{_first_line(error)}; {free_space(self.path(round_index))}",
                        self.path(round_index),
                    ) from None
                raise
        return self.path(round_index)

    def remove_all(self) -> None:
        """Deletes every checkpoint (an earlier run's, before ``--overwrite`` replaces it)."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def loop_state(self, round_index: int) -> dict:
        """The JSON record of one checkpoint."""
        with self._manager() as manager:
            return manager.restore(
                round_index, args=ocp.args.Composite(loop=ocp.args.JsonRestore())
            ).loop

    def restore_latest(self, target_trees):
        """``(trees, loop_state)`` of the newest intact checkpoint (read by process 0, given to
        every process), or None when there is none; see ``_restore_latest``."""
        if not hosts.distributed():
            return self._restore_latest(target_trees)
        found = hosts.on_primary(self._restore_latest, target_trees)
        loop_state = hosts.broadcast_json(found[1] if found else None)
        if loop_state is None:
            return None
        target = target_trees(loop_state) if callable(target_trees) else target_trees
        return hosts.broadcast_tree(found[0] if hosts.is_primary() else target), loop_state

    def _restore_latest(self, target_trees):
        """``(trees, loop_state)`` of the newest intact checkpoint, or None when there is none.
        ``target_trees`` is the dict of restore targets, or a function of the saved loop state that
        returns it (when the shapes depend on what was saved, e.g. how many clients hold a state). A
        newer checkpoint that cannot be read (a truncated or garbled file) is named in a one-line
        warning and moved to ``<directory>/damaged``; when none can be read, a ``ValueError`` names
        the newest one and why."""
        rounds = self._rounds()
        if not rounds:
            return None
        failures = []
        for round_index in reversed(rounds):
            try:
                loop_state = self.loop_state(round_index)
                target = target_trees(loop_state) if callable(target_trees) else target_trees
                with self._manager() as manager:
                    restored = manager.restore(
                        round_index, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
                    )
            except Exception as error:  # noqa: BLE001  (orbax / TensorStore / JSON errors of a damaged file)
                failures.append((round_index, _first_line(error)))
                continue
            # set aside, not deleted: the resumed run will save that round again
            for bad, why in failures:
                aside = os.path.join(self.directory, DAMAGED, os.path.basename(self.path(bad)))
                logging.warning(
                    "checkpoint %s cannot be read (%s): moved to %s; resuming from %s",
                    self.path(bad),
                    why,
                    aside,
                    self.path(round_index),
                )
                os.makedirs(os.path.dirname(aside), exist_ok=True)
                shutil.rmtree(aside, ignore_errors=True)
                os.replace(self.path(bad), aside)
            return restored.state, loop_state
        newest, why = failures[0]
        raise ValueError(
            f"--resume: no checkpoint under {self.directory} can be read; the newest, "
            f"{self.path(newest)}: {why}"
        )


# TensorStore appends the spec of what it was reading, a JSON dump hundreds of characters long
_SPECS = re.compile(r"\s*\[[\w\[\]]+='(?:[^'\\]|\\.)*'\]")


def _first_line(error: BaseException) -> str:
    """An error as one readable line: TensorStore's spec dumps dropped, and a long message cut in
    its middle, not its end (where the cause is: 'Requested byte range [0, 2062) is not valid for
    value of size 100')."""
    text = " ".join(_SPECS.sub("", str(error)).split())
    if len(text) > 240:
        text = f"{text[:80]} ... {text[-150:]}"
    return f"{type(error).__name__}: {text}"


def truncate_metrics(metrics_path: str, last_round: int) -> None:
    """Drops rows of rounds after ``last_round`` (written after the checkpoint a resume starts
    from), and a last line torn by a kill in mid-write (every complete row is one JSON object)."""
    with open(metrics_path) as f:
        lines = [line for line in f if line.strip()]
    rows = []
    for k, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if k == len(lines) - 1:
                break  # the torn last write of a killed run: recomputed after the resume
            raise ValueError(
                f"{metrics_path}: line {k + 1} is not a JSON row (and not the last): {line[:80]!r}"
            )
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
        # several processes: whether any was signalled, as of the last ``synchronize``
        self.snapshot = None

    def __bool__(self) -> bool:
        return self.event.is_set() if self.snapshot is None else self.snapshot

    def synchronize(self) -> None:
        """Under several processes: whether any process has been signalled, the same answer on each
        (a signal may reach one host only), until the next call."""
        self.snapshot = hosts.any_process(self.event.is_set())

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
