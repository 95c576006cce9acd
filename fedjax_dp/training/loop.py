"""The experiment loop: per round sample, pack, run the ``FederatedRound``, log; hooks for privacy
(budget stop, eligibility, epsilon), evaluation, divergence, checkpoints, progress and results.

It names no algorithm: the registry builds the round, the algorithm's ``requirements`` say what the
data side must provide, and the upload chain's declared releases say whether privacy is tracked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import jax
import numpy as np
from tqdm import tqdm  # (not tqdm.auto: no ipywidgets warning in notebooks)

from fedjax_dp.compression.traffic import broadcast_bytes, dense_upload_bytes
from fedjax_dp.core import rng as rng_lib
from fedjax_dp.core import tree
from fedjax_dp.core.client_states import ClientStateStore
from fedjax_dp.data.builders import build_dataset, build_server_set
from fedjax_dp.data.shared_set import share_with_clients
from fedjax_dp.models import evaluation_model
from fedjax_dp.training import plots, results
from fedjax_dp.training.build import (build_model_and_round, compression_rates, needs_server_set,
                                      privacy_tracker, server_set_breaches, server_set_notes, shares_server_set,
                                      validates_on_server_set)
from fedjax_dp.training.checkpointing import Checkpointer, Interruption, truncate_metrics  # noqa: F401
from fedjax_dp.training.cohorts import cohort_slots, make_packer, sample_cohort
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.divergence import DivergenceMonitor
from fedjax_dp.training.evaluation import evaluate_state
from fedjax_dp.training.personalized_evaluation import PersonalizedEvaluator
from fedjax_dp.training.prototype_adaptation import PrototypeAdaptation
from fedjax_dp.training.reporting import RunSummary, format_summary, privacy_record, progress_postfix, run_title  # noqa: F401
from fedjax_dp.training.run_state import LoopState
from fedjax_dp.training.tensorboard import TensorBoardScalars
from fedjax_dp.training.workdir_lock import WorkdirLock

STALL_ROUNDS = 3  # rounds in a row with every client update non-finite before the run stops


def central_test_from_clients(dataset) -> bool:
    """Whether the central test set holds clients' own test data (a source without a test split)."""
    tests = [t for t in dataset.client_test if len(t)]
    return bool(tests) and bool(np.isin(dataset.central_test, np.concatenate(tests)).any())


def personalized_evaluator(cfg, dataset, model, requirements):
    """The run's personalised evaluation: the algorithm's own, or with ``eval_prototypes`` the prototype
    adaptation of its global classifier; None when neither applies."""
    if requirements.personalized:
        return PersonalizedEvaluator(dataset)
    if cfg.eval_prototypes and requirements.global_classifier:
        return PersonalizedEvaluator(dataset, scorer=PrototypeAdaptation(evaluation_model(model)))
    return None


def run_experiment(cfg, workdir: str, overwrite: bool = False, progress: bool = True,
                   resume: bool = False, tensorboard: bool = False) -> RunSummary:
    """Runs one configured experiment and writes its results directory.

    ``resume`` continues the run in ``workdir`` from its newest checkpoint: the result is identical to
    an uninterrupted run. SIGINT / SIGTERM finish the round, checkpoint and return ``interrupted``.
    ``tensorboard`` also writes every round's scalars under ``<workdir>/tensorboard`` (tensorboardX).
    One run holds ``workdir`` at a time (``WorkdirLock``); ``overwrite`` first removes every artefact of the
    earlier run there, checkpoints included.
    """
    validate_config(cfg)
    with WorkdirLock(workdir):
        return _run_locked(cfg, workdir, overwrite, progress, resume, tensorboard)


def _run_locked(cfg, workdir: str, overwrite: bool, progress: bool, resume: bool, tensorboard: bool) -> RunSummary:
    if resume:  # before the data and the checkpoint are read: another config cannot restore into this one
        results.check_resumable(workdir, cfg.copy_and_resolve_references().to_json_best_effort(indent=2),
                                default_config().to_json_best_effort())
    else:  # an earlier run there is refused, or with overwrite removed whole (its checkpoints too)
        results.prepare_workdir(workdir, overwrite)
    scalars = TensorBoardScalars(os.path.join(workdir, "tensorboard")) if tensorboard else None
    start = time.perf_counter()
    dataset = build_dataset(cfg.data, cfg.seed)
    server_set = None
    if needs_server_set(cfg):
        server_set, dataset = build_server_set(cfg.data, cfg.server_data, dataset, cfg.seed)
    cfg = cfg.copy_and_resolve_references()
    choice, model, runner = build_model_and_round(cfg, dataset, server_set)
    requirements = runner.algorithm.requirements
    if not cfg.eval_client_data and not requirements.global_classifier:
        raise ValueError(f"eval_client_data=False: algorithm {cfg.algorithm!r} is scored only by personalised models on "
                         "the clients' own test data (its global model is not a classifier); set eval_client_data=True "
                         "(those figures are then listed in privacy.json's outside_guarantee)")
    if not cfg.eval_client_data and central_test_from_clients(dataset):
        raise ValueError(f"eval_client_data=False needs a held-out central test set, and data.source={cfg.data.source!r} "
                         "has none: its central test set is the union of the clients' own test data (use a source "
                         "with a test split, such as mnist or cifar10, or set eval_client_data=True)")
    if shares_server_set(cfg):
        dataset = share_with_clients(dataset, server_set)
    pack = make_packer(cfg, dataset, requirements)
    validation = server_set if validates_on_server_set(cfg) else None
    personalized = personalized_evaluator(cfg, dataset, model, requirements)
    tracker = privacy_tracker(cfg, runner, dataset)
    streams = rng_lib.run_streams(cfg.seed, cfg.privacy.secure_rng)
    params = model.init(streams.model_init)
    state = runner.init(params)
    loop = LoopState(*rng_lib.host_generators(cfg.seed, cfg.privacy.secure_rng), secure_rng=cfg.privacy.secure_rng)
    if requirements.client_state:
        loop.client_states = ClientStateStore(runner.algorithm.client_state_init(params))
    if runner.uploads.keeps_client_state:  # error feedback's residuals
        loop.upload_client_states = ClientStateStore(
            runner.uploads.client_state_init(runner.algorithm.upload_template(params)))
    loop.config = json.loads(cfg.to_json_best_effort())
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=cfg.checkpoint_keep or None)
    divergence = DivergenceMonitor(cfg.divergence_rounds)
    if resume:
        state = loop.restore(checkpointer, state, tracker, workdir, json.loads(default_config().to_json_best_effort()),
                             runner.uploads.releases)
        divergence.load(loop.divergence)
    writer = results.ResultsWriter(workdir, cfg.to_json_best_effort(indent=2), overwrite, append=resume,
                                   scalars=scalars, defaults_json=default_config().to_json_best_effort() if resume else None)
    template_bytes = dense_upload_bytes(runner.algorithm.upload_template(params))
    download_bytes = broadcast_bytes(runner.algorithm.broadcast(state))  # model (+ control variate...)

    if cfg.eval_initial and not resume:  # round 0: the initial model, before any client has been read
        loop.evaluated(0, evaluate_state(model, runner.algorithm, state, dataset, loop.client_states, validation,
                                         personalized, cfg.eval_client_data))
        writer.log({"round": 0, **loop.last_eval, "client_updates": 0, **({"epsilon": 0.0} if tracker else {})})
        divergence.start(loop.last_eval.get("test_loss"))
    interruption, stop_reason, diverged = Interruption(), None, False
    bar = tqdm(range(loop.rounds_run + 1, cfg.rounds + 1), disable=not progress, desc=cfg.algorithm, unit="round",
               initial=loop.rounds_run, total=cfg.rounds)
    with interruption.installed():
        for t in bar:
            uploads = runner.specialized(state)  # compression rates: fixed once per round, on the host
            releases = uploads.releases(t, state.uploads) if tracker is not None else []  # what round t will release
            eligible = tracker.eligible(t, releases) if tracker is not None else None
            if tracker is not None and (not tracker.allows(t, releases) or (
                    cfg.sampling.method == "uniform" and eligible.sum() < cfg.sampling.cohort_size)):
                tracker.stopped_at, stop_reason = t, "privacy budget"
                break
            ids = sample_cohort(cfg, dataset.num_clients, loop.sampling_rng, eligible)
            row = {"round": t, "cohort_size": len(ids)}
            if len(ids) or tracker is not None:
                cohort = pack(ids, loop.shuffle_rng, cohort_slots(cfg, dataset.num_clients, len(ids)))
                slots = cohort["mask"].shape[0]
                cohort["client_id"] = np.pad(np.asarray(ids, np.int32), (0, slots - len(ids)))
                step_noise = tracker.step_inputs(t, ids, slots) if tracker is not None else None
                stacked = loop.client_states.gather(ids, slots) if loop.client_states is not None else None
                stacked_uploads = (loop.upload_client_states.gather(ids, slots)
                                   if loop.upload_client_states is not None else None)
                upload_bytes, rates = uploads.upload_bytes(template_bytes), compression_rates(uploads)
                previous = state
                result = runner(state, cohort, rng_lib.round_key(streams.rounds, t), t, stacked, uploads,
                                noise_key=rng_lib.round_key(streams.noise, t), upload_client_states=stacked_uploads,
                                step_noise=step_noise)
                state = result.state
                if tracker is not None:  # accounted even if the result is discarded below (conservative)
                    tracker.record(t, ids, result.releases)
                    row.update(epsilon=tracker.epsilon(), formal=tracker.private)
                loop.participation.append([t, [int(i) for i in ids]])
                if not bool(tree.is_finite(state.params)):
                    state, stop_reason = previous, f"the global model diverged in round {t} (non-finite parameters)"
                    diverged = True
                    writer.log({**row, "diverged": True})
                    break
                dropped = result.dropped[:len(ids)]
                if loop.client_states is not None:  # a dropped client keeps its old state
                    loop.client_states.scatter(ids, result.client_states, ~dropped)
                if loop.upload_client_states is not None:
                    loop.upload_client_states.scatter(ids, result.upload_client_states, ~dropped)
                if dropped.any():  # non-finite updates: kept out of the model, counted, and named
                    row["dropped_client_ids"] = [int(i) for i in np.asarray(ids)[dropped]]
                    logging.warning("round %d: dropped non-finite updates of clients %s", t, row["dropped_client_ids"])
                row.update({k: float(v) for k, v in result.metrics.items()})
                loop.all_dropped_streak = loop.all_dropped_streak + 1 if len(ids) and dropped.all() else 0
                if loop.all_dropped_streak >= STALL_ROUNDS:
                    stop_reason = (f"every client update was non-finite for {STALL_ROUNDS} rounds in a row (to round "
                                   f"{t}): the global model has diverged")
                    diverged = True
                exploded = divergence.observe(t, row.get("train_loss"))
                loop.divergence = divergence.state()
                if exploded and not stop_reason:
                    stop_reason, diverged = exploded, True
                row.update(loop.meter.record(len(ids), upload_bytes, download_bytes))
                if rates is not None:
                    row["compression_rates"] = rates
                loop.client_updates += len(ids)
            loop.rounds_run = t
            if t % cfg.eval_every == 0 or t == cfg.rounds:
                loop.evaluated(t, evaluate_state(model, runner.algorithm, state, dataset, loop.client_states, validation,
                                                                 personalized, cfg.eval_client_data))
                row.update(loop.last_eval)
                bar.set_postfix(progress_postfix(loop.last_eval, row, tracker))
            row["client_updates"] = loop.client_updates
            writer.log(row)
            if stop_reason:
                break
            if interruption:
                stop_reason = f"interrupted by {interruption.signal_name}"
                break
            if cfg.checkpoint_every and t % cfg.checkpoint_every == 0:
                loop.save(checkpointer, state, tracker, time.perf_counter() - start)
    bar.close()
    if not interruption and loop.rounds_run and loop.rounds_run % cfg.eval_every and loop.rounds_run != cfg.rounds:
        loop.evaluated(loop.rounds_run, evaluate_state(model, runner.algorithm, state, dataset, loop.client_states, validation,
                                                                 personalized, cfg.eval_client_data))
        writer.log({"round": loop.rounds_run, "final_evaluation": True, **loop.last_eval})
    final = loop.last_evaluation if loop.last_evaluation_round == loop.rounds_run else evaluate_state(
        model, runner.algorithm, state, dataset, loop.client_states, None, personalized,  # interrupted: not yet evaluated
        cfg.eval_client_data)
    if cfg.eval_client_data:
        writer.write_json("client_accuracies.json", {"measured": final.per_client_label, "round": loop.rounds_run,
                                                     "client_ids": [i for i, t in enumerate(dataset.client_test) if len(t)],
                                                     "accuracy": final.per_client})
    writer.close()
    metrics = results.read_metrics(workdir)
    seconds = time.perf_counter() - start
    summary = RunSummary(workdir, loop.rounds_run, loop.last_eval, loop.best[0], loop.best[1], loop.client_updates,
                         seconds, dropped_updates=results.dropped_updates(metrics),
                         uplink_gb=loop.meter.uplink / 1e9, traffic_gb=(loop.meter.uplink + loop.meter.downlink) / 1e9,
                         stop_reason=stop_reason, interrupted=bool(interruption), diverged=diverged,
                         stopped_early=diverged, seconds_total=loop.seconds_total(seconds))
    record = privacy_record(tracker, server_set_notes(cfg), metrics, server_set_breaches(cfg),
                            secure_rng=cfg.privacy.secure_rng, client_test_set=central_test_from_clients(dataset),
                            wrote_client_accuracies=bool(cfg.eval_client_data))
    writer.write_json("privacy.json", record)
    if tracker is not None:
        report = tracker.report()
        summary.epsilon, summary.formal, summary.delta = report.epsilon, record["formal"], report.delta
        if "calibrated_epsilon" in report.accounting:
            target = report.accounting["calibrated_epsilon"]
            summary.calibration = (f"epsilon {target:.4g} for {report.accounting['calibrated_for']}; realised "
                                   + (f"max over clients {report.epsilon:.4g}" if tracker.local else
                                      f"{report.epsilon:.4g}"))
        summary.stopped_early = diverged or tracker.stopped_at is not None
    writer.write_json("summary.json", {**dataclasses.asdict(summary),
                                       "engine": {**dataclasses.asdict(choice), "ran_on_one_device": runner.ran_on_one_device},
                                       "backend": jax.default_backend()})
    if loop.rounds_run:  # after privacy.json and summary.json (a full disk must not cost them); a diverged model is
        loop.save(checkpointer, state, tracker, seconds)  # never saved (state is the last good one)
    plots.plot_run(results.read_metrics(workdir), os.path.join(workdir, "results.png"),
                   run_title(cfg, dataset.name, dataset.num_clients, tracker.report() if tracker else None),
                   final.per_client, final.per_client_label, [len(t) for t in dataset.client_test if len(t)])
    return summary
