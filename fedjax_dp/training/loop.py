"""The experiment loop: a short loop of rounds (``train``) with hooks around it
(``training.callbacks``: evaluation, divergence, progress, results and TensorBoard, checkpoints,
plots, and the user's own); ``training.run_context.RunContext`` holds the run and runs a round,
privacy included.

It names no algorithm: the registry builds the round, the algorithm's ``requirements`` say what the
data side must provide, and the upload chain's declared releases say whether privacy is tracked.
"""

from __future__ import annotations

import functools

from fedjax_dp.core import hosts
from fedjax_dp.training import console, results
from fedjax_dp.training.callbacks import default_callbacks
from fedjax_dp.training.checkpointing import Checkpointer, truncate_metrics  # noqa: F401
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.reporting import RunSummary, format_summary  # noqa: F401
from fedjax_dp.training.run_context import (
    RunContext,
    central_test_from_clients,  # noqa: F401
)
from fedjax_dp.training.privacy_plan import plan_line
from fedjax_dp.training.workdir_lock import held_by_process_zero


def run_experiment(
    cfg,
    workdir: str,
    overwrite: bool = False,
    progress: bool | str = True,
    resume: bool = False,
    tensorboard: bool = False,
    callbacks=(),
) -> RunSummary:
    """Runs one configured experiment and writes its results directory.

    ``resume`` continues the run in ``workdir`` from its newest checkpoint: the result is identical
    to an uninterrupted run. SIGINT / SIGTERM finish the round, checkpoint and return
    ``interrupted``. ``tensorboard`` also writes every round's scalars under
    ``<workdir>/tensorboard`` (tensorboardX). One run holds ``workdir`` at a time (``WorkdirLock``,
    taken first); ``overwrite`` first removes every artefact of the earlier run there, checkpoints
    included.
    ``callbacks``: the user's ``training.callbacks.Callback``s, run after the evaluation and before
    the row is written (``StopWhen`` stops on a metric). ``progress``: True shows a bar on a
    terminal and a line per evaluation elsewhere, ``"lines"`` always the lines, False nothing; with
    either, the slow phases and the privacy plan (noise, epsilon to spend) are said first
    (``training.console``, ``training.privacy_plan``).
    """
    mode = console.progress_mode(progress) if hosts.is_primary() else "off"
    # the lock first: a second run learns at once that the workdir is taken
    with held_by_process_zero(workdir), console.shown(mode):
        validate_config(cfg)
        run = RunContext.prepare(cfg, workdir, overwrite, resume, tensorboard)
        if mode != "off" and not resume:
            line = plan_line(run)
            if line:
                console.say(line)
        console.phase("compiling and running the first evaluation and round")
        return train(run, default_callbacks(run.cfg, mode, callbacks))


def train(run: RunContext, callbacks) -> RunSummary:
    """The loop: round after round until the last, a stop (privacy budget, divergence, a callback's
    reason) or an interrupting signal; the callbacks around it (``training.callbacks``)."""
    for callback in callbacks:
        callback.on_train_begin(run)
    with run.interruption.installed():
        for t in range(run.loop.rounds_run + 1, run.cfg.rounds + 1):
            row = run.round(t)
            # what every process's callbacks see: a signal that reached one host stops all
            if hosts.distributed():
                run.interruption.synchronize()
            if after_round(run, t, row, callbacks):
                break
    # every end hook is tried, even after one failed (a full disk: ``results.attempt_each``)
    results.attempt_each([functools.partial(c.on_train_end, run) for c in callbacks])
    return run.summary


def after_round(run: RunContext, t: int, row: dict | None, callbacks) -> bool:
    """Round t's row through the callbacks; whether the run stops here (the privacy budget, a
    non-finite global model, a callback's reason, an interrupting signal)."""
    if row is None:  # the privacy budget would be exceeded: round t does not run
        return True
    # a non-finite global model: the last good state is kept, nothing more is done
    if run.halted:
        run.writer.log(row)
        return True
    for callback in callbacks:
        reason = callback.after_round(run, t, row)
        if reason:
            run.stop(reason)
    if run.stop_reason:
        return True
    if run.interruption:
        run.stop(f"interrupted by {run.interruption.signal_name or 'a signal to another process'}")
        return True
    return False
