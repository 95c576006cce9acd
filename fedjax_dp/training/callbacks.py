"""Hooks around the training loop (pfl-research's ``TrainingProcessCallback`` shape):
evaluation, divergence, the progress bar, results and TensorBoard, checkpoints and plots are
callbacks on a short loop (``training.loop.train``), and a user passes their own from Python
(``run_experiment(..., callbacks=[...])``, ``Experiment.run(..., callbacks=[...])``): log every row
to their tracker, stop on a metric (``StopWhen``).

Each hook gets the ``RunContext``. ``after_round`` gets the round's row and may add to it (an
evaluation's metrics) or return a reason to stop after this round. Callbacks run in list order:
evaluation and divergence first, then a user's callbacks (``run_experiment`` puts them there: what
they add to the row is written), then ``Results`` writes the row, then ``Checkpoints`` saves (a row
is always written before the checkpoint of its round, so a resume never lacks one). At the end
the files a run cannot do without come first: ``Results`` writes ``privacy.json``, ``Checkpoints``
the final model, then ``Summary`` writes ``summary.json`` and ``client_accuracies.json`` and
``Plots`` ``results.png``; every end hook runs even after one has failed (a full disk costs only
the files it cannot take), and the first failure is raised.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os

import jax
from tqdm import tqdm  # (not tqdm.auto: no ipywidgets warning in notebooks)

from fedjax_dp.algorithms import registry
from fedjax_dp.core import hosts
from fedjax_dp.training import console, plots, results
from fedjax_dp.training.build import server_set_breaches, server_set_notes
from fedjax_dp.training.divergence import DivergenceMonitor
from fedjax_dp.training.reporting import (
    RunSummary,
    empirical_brief,
    privacy_record,
    progress_postfix,
    run_title,
)
from fedjax_dp.training.run_context import RunContext, central_test_from_clients


class Callback:
    """The hooks; each does nothing unless overridden."""

    def on_train_begin(self, run: RunContext) -> None:
        pass

    def after_round(self, run: RunContext, t: int, row: dict) -> str | None:
        """After round t ran (before its row is written): add to ``row``; return a reason to stop
        after it."""
        return None

    def on_train_end(self, run: RunContext) -> None:
        pass


class Evaluation(Callback):
    """Round 0 (the initial model), every ``eval_every`` rounds and the last round; a final
    evaluation where the run stopped between evaluations."""

    def on_train_begin(self, run):
        if run.cfg.eval_initial and not run.resumed:  # before any client has been read
            run.loop.evaluated(0, run.evaluate())
            run.writer.log(
                {
                    "round": 0,
                    **run.loop.last_eval,
                    "client_updates": 0,
                    **({"epsilon": 0.0} if run.tracker else {}),
                }
            )

    def after_round(self, run, t, row):
        if t % run.cfg.eval_every == 0 or t == run.cfg.rounds:
            run.loop.evaluated(t, run.evaluate())
            row.update(run.loop.last_eval)

    def on_train_end(self, run):
        rounds = run.loop.rounds_run
        if (
            not run.interruption
            and rounds
            and rounds % run.cfg.eval_every
            and rounds != run.cfg.rounds
        ):
            run.loop.evaluated(rounds, run.evaluate())
            run.writer.log({"round": rounds, "final_evaluation": True, **run.loop.last_eval})


class Divergence(Callback):
    """Stops a run, DP or not, whose training loss has diverged (``training.divergence``)."""

    def __init__(self, window: int):
        self.monitor = DivergenceMonitor(window)

    def on_train_begin(self, run):
        self.monitor.load(run.loop.divergence)
        if not run.resumed:
            # the initial model's, where round 0 ran
            self.monitor.start(run.loop.last_eval.get("test_loss"))

    def after_round(self, run, t, row):
        reason = self.monitor.observe(t, row.get("train_loss"))
        run.loop.divergence = self.monitor.state()
        if reason:
            run.stop(reason, diverged=True)
        return None


class Progress(Callback):
    """Progress (``training.console``): the bar (round, accuracy, loss and epsilon spent) on a
    terminal, or one line per evaluation where the output is a log file (``mode="lines"``)."""

    def __init__(self, mode: str):
        self.mode, self.bar = mode, None

    def on_train_begin(self, run):
        if self.mode == "lines" and run.loop.last_evaluation_round == 0:
            console.say(self._line(run, 0, {"epsilon": 0.0} if run.tracker else {}))
        self.bar = tqdm(
            total=run.cfg.rounds,
            initial=run.loop.rounds_run,
            disable=self.mode != "bar",
            desc=run.cfg.algorithm,
            unit="round",
        )

    def after_round(self, run, t, row):
        self.bar.update(1)
        if run.loop.last_evaluation_round == t:
            self.bar.set_postfix(progress_postfix(run.loop.last_eval, row, run.tracker))
            if self.mode == "lines":
                console.say(self._line(run, t, row))

    def _line(self, run, t, row):
        """``round t/T: <accuracy> ..., test_loss ..., train_loss ..., epsilon ... (seconds)``."""
        evaluation = run.loop.last_eval
        accuracy = next(
            (k for k in ("personalized_accuracy", "test_accuracy") if k in evaluation), None
        )
        shown = [(k, evaluation.get(k)) for k in (accuracy, "test_loss") if k]
        shown += [("train_loss", row.get("train_loss")), ("epsilon", row.get("epsilon"))]
        text = ", ".join(f"{k} {v:.4g}" for k, v in shown if isinstance(v, (int, float)))
        formal = "" if row.get("formal", True) else " (formal: false)"
        return f"round {t}/{run.cfg.rounds}: {text}{formal} ({run.seconds():.1f} s)"

    def on_train_end(self, run):
        self.bar.close()


class Results(Callback):
    """Each round's row into ``metrics.jsonl`` (and TensorBoard); at the end ``privacy.json``, the
    first file a run's end writes (``Summary`` writes the rest, after the final checkpoint)."""

    def after_round(self, run, t, row):
        row["client_updates"] = run.loop.client_updates
        run.writer.log(row)

    def on_train_end(self, run):
        loop = run.loop
        self.final = (
            loop.last_evaluation
            if loop.last_evaluation_round == loop.rounds_run
            else run.evaluate(with_validation=False)
        )  # interrupted: not yet evaluated
        self.metrics, self.record = [], None
        # process 0 writes the files (several hosts: ``core.hosts``)
        hosts.on_primary(results.attempt_each, [run.writer.close, lambda: self._write(run)])

    def _write(self, run):
        cfg = run.cfg
        self.metrics = results.read_metrics(run.workdir)
        self.record = privacy_record(
            run.tracker,
            server_set_notes(cfg),
            self.metrics,
            server_set_breaches(cfg),
            secure_rng=cfg.privacy.secure_rng,
            client_test_set=central_test_from_clients(run.dataset),
            wrote_client_accuracies=bool(cfg.eval_client_data),
            privacy_unit=run.dataset.metadata.get("privacy_unit"),
        )
        for wrapper in registry.wrappers():  # what a wrapper says of itself (hypergrad's source)
            if wrapper.enabled(cfg) and wrapper.privacy_label is not None:
                self.record[wrapper.name] = wrapper.privacy_label(cfg)
        if run.audit is not None and hosts.is_primary():
            self.record["empirical"] = empirical_record(run)
            if run.loop.audit_state is not None:
                self.record["outside_guarantee"].append(
                    "empirical: computed from the canary model trained beside the run's on the"
                    " same clients (audit.side_by_side)"
                )
        run.writer.write_json("privacy.json", self.record)


def empirical_record(run) -> dict:
    """The canaries' estimate for ``privacy.json``; a failure is recorded, never lets the file go
    unwritten."""
    try:
        model = run.loop.audit_state if run.loop.audit_state is not None else run.state
        return run.audit.report(model.params, run.tracker)
    except Exception as error:  # noqa: BLE001 (privacy.json is written whatever happens here)
        logging.exception("the canary audit failed")
        return {"kind": "an empirical estimate, NOT a guarantee", "error": repr(error)}


class Summary(Callback):
    """At the end, after the final checkpoint: ``summary.json`` and ``client_accuracies.json``, and
    the run's ``RunSummary`` (every process gets it)."""

    def __init__(self, results_callback: Results):
        self.results = results_callback

    def on_train_end(self, run):
        summary = hosts.on_primary(self._write, run, share=True)
        run.summary = RunSummary(**summary) if isinstance(summary, dict) else summary

    def _write(self, run):
        loop, cfg, dataset, tracker = run.loop, run.cfg, run.dataset, run.tracker
        final, metrics, record = self.results.final, self.results.metrics, self.results.record
        seconds = run.seconds()
        summary = RunSummary(
            run.workdir,
            loop.rounds_run,
            loop.last_eval,
            loop.best[0],
            loop.best[1],
            loop.client_updates,
            seconds,
            dropped_updates=results.dropped_updates(metrics),
            uplink_gb=loop.meter.uplink / 1e9,
            traffic_gb=(loop.meter.uplink + loop.meter.downlink) / 1e9,
            stop_reason=run.stop_reason,
            interrupted=bool(run.interruption),
            diverged=run.diverged,
            stopped_early=run.diverged,
            seconds_total=loop.seconds_total(seconds),
        )
        if tracker is not None:
            report = tracker.report()
            summary.epsilon, summary.delta = report.epsilon, report.delta
            summary.formal = record["formal"] if record else report.formal
            if "calibrated_epsilon" in report.accounting:
                target = report.accounting["calibrated_epsilon"]
                summary.calibration = (
                    f"epsilon {target:.4g} for {report.accounting['calibrated_for']}; realised "
                    + (
                        f"max over clients {report.epsilon:.4g}"
                        if tracker.local
                        else f"{report.epsilon:.4g}"
                    )
                )
            summary.stopped_early = run.diverged or tracker.stopped_at is not None
        summary.empirical = empirical_brief((record or {}).get("empirical"))
        writes = [
            lambda: run.writer.write_json(
                "summary.json",
                {
                    **dataclasses.asdict(summary),
                    "engine": {
                        **dataclasses.asdict(run.choice),
                        "ran_on_one_device": run.runner.ran_on_one_device,
                    },
                    "backend": jax.default_backend(),
                    "processes": jax.process_count(),
                },
            )
        ]
        if cfg.eval_client_data:
            writes.append(
                lambda: run.writer.write_json(
                    "client_accuracies.json",
                    {
                        "measured": final.per_client_label,
                        "round": loop.rounds_run,
                        "client_ids": [i for i, t in enumerate(dataset.client_test) if len(t)],
                        "accuracy": final.per_client,
                    },
                )
            )
        results.attempt_each(writes)
        return dataclasses.asdict(summary) if hosts.distributed() else summary


class Checkpoints(Callback):
    """A checkpoint every ``checkpoint_every`` rounds (none after the round the run stops in: the
    final one is written at the end, after the results), and one at the end; a diverged model is
    never saved (the run keeps the last good state)."""

    def after_round(self, run, t, row):
        every = run.cfg.checkpoint_every
        if every and t % every == 0 and not run.stop_reason and not run.interruption:
            run.loop.save(run.checkpointer, run.state, run.tracker, run.seconds())

    def on_train_end(self, run):
        if run.loop.rounds_run:
            run.loop.save(run.checkpointer, run.state, run.tracker, run.seconds())


class Plots(Callback):
    """``results.png``: accuracy, loss and epsilon against rounds, and the per-client accuracies."""

    def __init__(self, results_callback: Results):
        self.results = results_callback

    def on_train_end(self, run):
        if not hosts.is_primary():
            return
        final = self.results.final
        plots.plot_run(
            results.read_metrics(run.workdir),
            os.path.join(run.workdir, "results.png"),
            run_title(
                run.cfg,
                run.dataset.name,
                run.dataset.num_clients,
                run.tracker.report() if run.tracker else None,
            ),
            final.per_client,
            final.per_client_label,
            [len(t) for t in run.dataset.client_test if len(t)],
        )


def default_callbacks(cfg, progress: str, extra=()) -> list[Callback]:
    """The loop's own callbacks in the order they run, a user's ``extra`` ones before the row is
    written; ``progress``: ``"bar"``, ``"lines"`` or ``"off"`` (``console.progress_mode``)."""
    written = Results()
    return [
        Evaluation(),
        Divergence(cfg.divergence_rounds),
        Progress(progress),
        *extra,
        written,
        Checkpoints(),
        Summary(written),
        Plots(written),
    ]


@dataclasses.dataclass
class StopWhen(Callback):
    """Stops the run once ``metric`` reaches ``at_least`` (or falls to ``at_most``) in a round's
    row: a user's callback, e.g. ``run_experiment(cfg, workdir, callbacks=[StopWhen("test_accuracy",
    at_least=0.9)])``."""

    metric: str
    at_least: float = math.inf
    at_most: float = -math.inf

    def after_round(self, run, t, row):
        value = row.get(self.metric)
        if value is not None and (value >= self.at_least or value <= self.at_most):
            bound = f">= {self.at_least:g}" if value >= self.at_least else f"<= {self.at_most:g}"
            return f"{self.metric} = {value:.4g} {bound} in round {t} (StopWhen)"
        return None
