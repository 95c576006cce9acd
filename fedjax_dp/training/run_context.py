"""``RunContext``: everything one experiment run holds (data, model, round, privacy tracker, loop
state, results writer) and the one thing the loop asks of it, ``round(t)``.

A round is privacy first: the releases round t will run (the specialised chain's), which clients may
take part and whether the budget lets the round run at all (the tracker); then the cohort is drawn,
packed and trained, the releases that ran are composed, and the round's row of metrics is returned
for the callbacks (``training.callbacks``) to extend, judge and write. Under several processes
(``core.hosts``) every process holds the same context and runs the same rounds; each packs only its
own rows of a cohort, and only process 0 writes (the others get a ``DiscardingWriter``). Privacy is
not a callback: it decides who takes part and what is released (as jax_privacy's execution plan
keeps batch selection and noise together).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time

import numpy as np

from fedjax_dp.compression.traffic import broadcast_bytes, dense_upload_bytes
from fedjax_dp.core import hosts
from fedjax_dp.core import rng as rng_lib
from fedjax_dp.core import tree
from fedjax_dp.core.client_states import ClientStateStore
from fedjax_dp.data.builders import build_dataset, build_server_set
from fedjax_dp.data.shared_set import share_with_clients
from fedjax_dp.models import evaluation_model
from fedjax_dp.privacy.audit.in_run import CanaryAudit
from fedjax_dp.privacy.sampling import build as client_sampler
from fedjax_dp.training import console, results
from fedjax_dp.training.build import (
    build_model_and_round,
    check_releases_before_data,
    compression_rates,
    needs_server_set,
    privacy_tracker,
    shares_server_set,
    validates_on_server_set,
)
from fedjax_dp.training.checkpointing import Checkpointer, Interruption
from fedjax_dp.training.cohorts import cohort_slots, make_packer, sample_cohort
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.evaluation import evaluate_state
from fedjax_dp.training.fit_to_data import fit_to_data
from fedjax_dp.training.personalized_evaluation import PersonalizedEvaluator
from fedjax_dp.training.prototype_adaptation import PrototypeAdaptation
from fedjax_dp.training.run_state import LoopState
from fedjax_dp.training.tensorboard import TensorBoardScalars

STALL_ROUNDS = 3  # rounds in a row with every client update non-finite before the run stops


def central_test_from_clients(dataset) -> bool:
    """Whether the central test set holds clients' own test data (a source without a test split)."""
    tests = [t for t in dataset.client_test if len(t)]
    return bool(tests) and bool(np.isin(dataset.central_test, np.concatenate(tests)).any())


def personalized_evaluator(cfg, dataset, model, requirements):
    """The run's personalised evaluation: the algorithm's own, or with ``eval_prototypes`` the
    prototype adaptation of its global classifier; None when neither applies."""
    if requirements.personalized:
        return PersonalizedEvaluator(dataset)
    if cfg.eval_prototypes and requirements.global_classifier:
        return PersonalizedEvaluator(dataset, scorer=PrototypeAdaptation(evaluation_model(model)))
    return None


@dataclasses.dataclass
class RunContext:
    cfg: object
    workdir: str
    dataset: object
    server_set: object
    choice: object
    model: object
    runner: object
    tracker: object
    streams: object
    state: object
    loop: LoopState
    checkpointer: Checkpointer
    writer: results.ResultsWriter
    resumed: bool
    start: float
    pack: object = None
    validation: object = None
    personalized: object = None
    template_bytes: int = 0
    download_bytes: int = 0
    interruption: Interruption = dataclasses.field(default_factory=Interruption)
    stop_reason: str | None = None
    diverged: bool = False
    # the round's row is the last and no callback may extend it (a non-finite model)
    halted: bool = False
    summary: object = None  # the ``RunSummary``, once the results callback has written it
    audit: CanaryAudit | None = None  # canary clients (``audit.canaries``)

    @classmethod
    def prepare(
        cls, cfg, workdir: str, overwrite: bool, resume: bool, tensorboard: bool
    ) -> "RunContext":
        """Data, model, round, tracker and loop state of ``cfg`` (restored from the newest
        checkpoint with ``resume``), and its results writer; an earlier run in ``workdir`` is
        refused or, with ``overwrite``, removed first."""
        # before the data and the checkpoint are read: another config cannot restore into this one
        if resume:
            hosts.on_primary(
                results.check_resumable,
                workdir,
                cfg.copy_and_resolve_references().to_json_best_effort(indent=2),
                default_config().to_json_best_effort(),
            )
        # an earlier run there is refused, or with overwrite removed whole (its checkpoints too)
        else:
            hosts.on_primary(results.prepare_workdir, workdir, overwrite)
        scalars = (
            TensorBoardScalars(os.path.join(workdir, "tensorboard"))
            if tensorboard and hosts.is_primary()
            else None
        )
        check_releases_before_data(cfg)  # an event no ledger composes: refused before the data
        start = time.perf_counter()
        console.phase(f"loading data: {cfg.data.source}, {cfg.data.partition} partition")
        dataset = build_dataset(cfg.data, cfg.seed)
        server_set = None
        if needs_server_set(cfg):
            server_set, dataset = build_server_set(cfg.data, cfg.server_data, dataset, cfg.seed)
        cfg = cfg.copy_and_resolve_references()
        # a source's own client count; a user's model checked against the data, before any build
        cfg, dataset = fit_to_data(cfg, dataset)
        choice, model, runner = build_model_and_round(cfg, dataset, server_set)
        requirements = runner.algorithm.requirements
        _check_evaluation(cfg, dataset, requirements)
        if shares_server_set(cfg):
            dataset = share_with_clients(dataset, server_set)
        # refuses data the cohorts cannot be packed from, first
        pack = make_packer(cfg, dataset, requirements)
        tracker = privacy_tracker(cfg, runner, dataset)
        entropy = hosts.shared_entropy() if cfg.privacy.secure_rng and hosts.distributed() else None
        streams = rng_lib.run_streams(cfg.seed, cfg.privacy.secure_rng, entropy)
        params = model.init(streams.model_init)
        state = runner.init(params)
        loop = LoopState(
            *rng_lib.host_generators(cfg.seed, cfg.privacy.secure_rng, entropy),
            secure_rng=cfg.privacy.secure_rng,
        )
        if requirements.client_state:
            loop.client_states = ClientStateStore(runner.algorithm.client_state_init(params))
        if runner.uploads.keeps_client_state:  # error feedback's residuals
            loop.upload_client_states = ClientStateStore(
                runner.uploads.client_state_init(runner.algorithm.upload_template(params))
            )
        loop.config = json.loads(cfg.to_json_best_effort())
        checkpointer = Checkpointer(
            os.path.join(workdir, "checkpoints"), keep=cfg.checkpoint_keep or None
        )
        if cfg.audit.canaries and cfg.audit.side_by_side:
            loop.audit_state = state  # the canary model starts where the run's does
        if resume:
            state = loop.restore(
                checkpointer,
                state,
                tracker,
                workdir,
                json.loads(default_config().to_json_best_effort()),
                runner.uploads.releases,
            )
        audit = (
            CanaryAudit(
                cfg.audit,
                cfg.seed,
                dataset.num_clients,
                params,
                runner.algorithm.upload_template(params),
                cfg.dp.clip_norm,
                tracker.settings.delta,
                os.path.join(workdir, "audit"),
                loop.rounds_run,
                write=hosts.is_primary(),
            )
            if cfg.audit.canaries
            else None
        )
        writer = hosts.on_primary(
            results.ResultsWriter,
            workdir,
            cfg.to_json_best_effort(indent=2),
            overwrite,
            append=resume,
            scalars=scalars,
            defaults_json=default_config().to_json_best_effort() if resume else None,
        )
        writer = writer or results.DiscardingWriter(workdir)  # None on every process but process 0
        return cls(
            cfg,
            workdir,
            dataset,
            server_set,
            choice,
            model,
            runner,
            tracker,
            streams,
            state,
            loop,
            checkpointer,
            writer,
            resume,
            start,
            pack=pack,
            validation=server_set if validates_on_server_set(cfg) else None,
            personalized=personalized_evaluator(cfg, dataset, model, requirements),
            template_bytes=dense_upload_bytes(runner.algorithm.upload_template(params)),
            download_bytes=broadcast_bytes(runner.algorithm.broadcast(state)),
            audit=audit,
        )

    def seconds(self) -> float:
        """This process's time so far."""
        return time.perf_counter() - self.start

    def evaluate(self, with_validation: bool = True):
        """The ``evaluation.Evaluation`` of the current state (``with_validation``: on the
        server-held validation set too, where the run has one)."""
        return evaluate_state(
            self.model,
            self.runner.algorithm,
            self.state,
            self.dataset,
            self.loop.client_states,
            self.validation if with_validation else None,
            self.personalized,
            self.cfg.eval_client_data,
        )

    @functools.cached_property
    def sampler(self):
        """The sampler that draws the cohorts (and whose events the tracker composes)."""
        return client_sampler(self.cfg.sampling, self.dataset.num_clients)

    def stop(self, reason: str, diverged: bool = False) -> None:
        if self.stop_reason is None:
            self.stop_reason, self.diverged = reason, diverged

    def round(self, t: int) -> dict | None:
        """Runs round t (module docstring); returns its row, or None where the budget stops the run
        before it: ``plan_round``, ``execute`` and ``finish_round`` (a batch of runs in lockstep,
        ``training.run_batch``, runs the middle step for several runs at once)."""
        plan = self.plan_round(t)
        if plan is None:
            return None
        if plan.cohort is None:  # no client and nothing private: an empty round
            self.loop.rounds_run = t
            return plan.row
        result, settings_row = self.execute(plan)
        return self.finish_round(plan, result, settings_row)

    def plan_round(self, t: int) -> RoundPlan | None:
        """Round t up to the training: the budget check (None where it stops the run), the cohort
        drawn and packed, the keys and the chain's inputs."""
        cfg, tracker, loop, runner = self.cfg, self.tracker, self.loop, self.runner
        # compression rates: fixed once per round, on the host
        uploads = runner.specialized(self.state)
        # what round t releases
        releases = uploads.releases(t, self.state.uploads) if tracker is not None else []
        eligible = tracker.eligible(t, releases) if tracker is not None else None
        if tracker is not None and (
            not tracker.allows(t, releases) or not self.sampler.can_draw(eligible)
        ):
            tracker.stopped_at = t
            self.stop("privacy budget")
            return None
        ids = sample_cohort(cfg, self.dataset.num_clients, loop.sampling_rng, eligible, t)
        row = {"round": t, "cohort_size": len(ids)}
        if not (len(ids) or tracker is not None):
            return RoundPlan(t, ids, row)
        slots = cohort_slots(cfg, self.dataset.num_clients, len(ids))
        # several hosts: an equal share each (empty slots add exactly zero)
        if runner.slot_multiple > 1:
            slots = hosts.padded_slots(max(slots or 0, len(ids)), runner.slot_multiple)
            cohort = self.pack(ids, loop.shuffle_rng, slots, hosts.host_rows(slots))
        else:
            cohort = self.pack(ids, loop.shuffle_rng, slots)
        slots = cohort["mask"].shape[0]
        cohort["client_id"] = np.pad(np.asarray(ids, np.int32), (0, slots - len(ids)))
        step_noise = tracker.step_inputs(t, ids, slots) if tracker is not None else None
        stacked = loop.client_states.gather(ids, slots) if loop.client_states is not None else None
        stacked_uploads = (
            loop.upload_client_states.gather(ids, slots)
            if loop.upload_client_states is not None
            else None
        )
        inputs = dict(
            round_index=t,
            client_states=stacked,
            uploads=uploads,
            noise_key=rng_lib.round_key(self.streams.noise, t),
            upload_client_states=stacked_uploads,
            step_noise=step_noise,
        )
        return RoundPlan(
            t,
            ids,
            row,
            cohort,
            rng_lib.round_key(self.streams.rounds, t),
            inputs,
            uploads.upload_bytes(self.template_bytes),
            compression_rates(uploads),
            self.audit.cohort(t, ids) if self.audit is not None else None,
        )

    def execute(self, plan: RoundPlan):
        """``(result, settings_row)``: the planned round run (``FederatedRound``), beside the
        canaries' model where the audit runs side by side, and an algorithm's adaptation of its own
        settings after it (``hypergrad``)."""
        runner, loop, cohort, key, inputs = (
            self.runner,
            self.loop,
            plan.cohort,
            plan.key,
            plan.inputs,
        )
        if loop.audit_state is not None:  # side by side: the run's model has no canaries
            result = runner(self.state, cohort, key, **inputs)
            own = {**inputs, "uploads": runner.specialized(loop.audit_state)}
            beside = runner(loop.audit_state, cohort, key, canaries=plan.canaries, **own)
            loop.audit_state = beside.state
            self.audit.observe(beside.released)
        else:
            result = runner(self.state, cohort, key, canaries=plan.canaries, **inputs)
            if self.audit is not None:  # released, whatever becomes of the state
                self.audit.observe(result.released)
        # an algorithm that adapts its own settings after the round (``hypergrad``)
        adapt_settings = getattr(runner.algorithm, "adapt_settings", None)
        settings_row = {}
        if adapt_settings is not None:
            result.state, settings_row = adapt_settings(
                runner, self.state, result, cohort, key, inputs
            )
        return result, settings_row

    def finish_round(self, plan: RoundPlan, result, settings_row: dict | None = None) -> dict:
        """Round t after the training: the releases composed, the new state kept (or the last good
        one, where it is not finite), per-client states stored, and the row."""
        tracker, loop, t, ids, row = self.tracker, self.loop, plan.t, plan.ids, plan.row
        previous = self.state
        self.state = result.state
        # accounted even if the result is discarded below (conservative)
        if tracker is not None:
            tracker.record(t, ids, result.releases)
            row.update(epsilon=tracker.epsilon(), formal=tracker.private)
        loop.participation.append([t, [int(i) for i in ids]])
        if not bool(tree.is_finite(self.state.params)):
            self.state = previous
            self.stop(
                f"the global model diverged in round {t} (non-finite parameters)", diverged=True
            )
            self.halted = True
            return {**row, "diverged": True}
        dropped = result.dropped[: len(ids)]
        if loop.client_states is not None:  # a dropped client keeps its old state
            loop.client_states.scatter(ids, result.client_states, ~dropped)
        if loop.upload_client_states is not None:
            loop.upload_client_states.scatter(ids, result.upload_client_states, ~dropped)
        if dropped.any():  # non-finite updates: kept out of the model, counted, and named
            row["dropped_client_ids"] = [int(i) for i in np.asarray(ids)[dropped]]
            logging.warning(
                "round %d: dropped non-finite updates of clients %s",
                t,
                row["dropped_client_ids"],
            )
        row.update({k: float(v) for k, v in result.metrics.items()})
        row.update(settings_row or {})
        loop.all_dropped_streak = loop.all_dropped_streak + 1 if len(ids) and dropped.all() else 0
        if loop.all_dropped_streak >= STALL_ROUNDS:
            self.stop(
                f"every client update was non-finite for {STALL_ROUNDS} rounds in a row (to"
                f" round {t}): the global model has diverged",
                diverged=True,
            )
        row.update(loop.meter.record(len(ids), plan.upload_bytes, self.download_bytes))
        if plan.rates is not None:
            row["compression_rates"] = plan.rates
        loop.client_updates += len(ids)
        loop.rounds_run = t
        return row


@dataclasses.dataclass
class RoundPlan:
    """Round t as planned before its training (``RunContext.plan_round``): the cohort's ids and
    its row so far; where a cohort trains, its packed data, the round's key, the arguments of
    ``FederatedRound.__call__`` (``inputs``), the upload's size and compression rates, and the
    audit's canaries."""

    t: int
    ids: object
    row: dict
    cohort: dict | None = None
    key: object = None
    inputs: dict | None = None
    upload_bytes: int = 0
    rates: object = None
    canaries: object = None


def _check_evaluation(cfg, dataset, requirements) -> None:
    """``eval_client_data=False`` needs something to evaluate that is not client data."""
    if not cfg.eval_client_data and not requirements.global_classifier:
        raise ValueError(
            f"eval_client_data=False: algorithm {cfg.algorithm!r} is scored only by personalised"
            " models on the clients' own test data (its global model is not a classifier); set"
            " eval_client_data=True (those figures are then listed in privacy.json's"
            " outside_guarantee)"
        )
    if not cfg.eval_client_data and central_test_from_clients(dataset):
        raise ValueError(
            "eval_client_data=False needs a held-out central test set, and"
            f" data.source={cfg.data.source!r} has none: its central test set is the union of the"
            " clients' own test data (use a source with a test split, such as mnist or cifar10, or"
            " set eval_client_data=True)"
        )
