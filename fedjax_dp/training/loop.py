"""The experiment loop: per round sample, pack, train, aggregate; evaluate every k rounds; log.

With a DP algorithm (``dp_fedavg``, ``dp_uga``) the loop also accounts: before each round the budget rule decides
whether the round may run (training stops otherwise), clients whose own budget is spent are not
sampled, and every round's epsilon is logged; ``privacy.json`` holds the final report.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from fedjax_dp.algorithms.fedmeta import META_DATA_NOTE
from fedjax_dp.algorithms.fedshare import share_with_clients
from fedjax_dp.algorithms.scaffold import CLIENT_STATE_KEY
from fedjax_dp.compression.traffic import TrafficMeter, dense_upload_bytes
from fedjax_dp.core import rng as rng_lib
from fedjax_dp.core import tree
from fedjax_dp.core.client_states import ClientStateStore
from fedjax_dp.core.strategy import StrategyChoice, choose_strategy
from fedjax_dp.data import sampling
from fedjax_dp.data.builders import build_dataset, build_server_set
from fedjax_dp.data.packing import num_steps, pack_cohort, pack_uga_cohort
from fedjax_dp.models import get_model
from fedjax_dp.privacy.accounting import calibrate_noise_multiplier
from fedjax_dp.training import results
from fedjax_dp.training.checkpointing import Checkpointer, Interruption, truncate_metrics
from fedjax_dp.training.compression_control import CompressionControl
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.evaluation import evaluate
from fedjax_dp.training.algorithm_factory import DP_ALGORITHMS, build_algorithm, expected_cohort, needs_server_set
from fedjax_dp.training.privacy_tracking import PrivacyTracker

@dataclasses.dataclass
class RunSummary:
    workdir: str
    rounds: int
    final: dict
    best_accuracy: float
    best_round: int
    client_updates: int
    seconds: float
    epsilon: float | None = None
    stopped_early: bool = False
    uplink_gb: float = 0.0  # bytes actually sent by clients (compression.traffic), all rounds
    traffic_gb: float = 0.0  # uplink + downlink
    stop_reason: str | None = None  # privacy budget, divergence, or an interrupting signal
    interrupted: bool = False  # stopped by SIGINT / SIGTERM: resume with ``resume=True`` / ``--resume``


def resolve_engine(cfg, has_conv: bool, cohort_size: int) -> StrategyChoice:
    """``auto`` fields replaced by the measured choice (``core.strategy``); explicit values kept."""
    auto = choose_strategy(has_conv, cohort_size)
    e = cfg.engine
    return StrategyChoice(
        strategy=auto.strategy if e.strategy == "auto" else e.strategy,
        chunk_size=(auto.chunk_size if e.strategy == "auto" else (e.chunk_size or None)),
        unroll=auto.unroll if e.unroll == "auto" else (True if e.unroll == "full" else int(e.unroll)),
        conv_impl=auto.conv_impl if e.conv_impl == "auto" else e.conv_impl,
    )


def calibrate_if_asked(cfg, num_clients: int) -> None:
    """``dp.calibrate_epsilon > 0``: set ``dp.noise_multiplier`` so that ``rounds`` rounds spend
    exactly that epsilon at ``dp.delta`` (dp_accounting's calibration)."""
    dp = cfg.dp
    if cfg.algorithm not in DP_ALGORITHMS or not dp.calibrate_epsilon:
        return
    uniform = cfg.sampling.method == "uniform"
    dp.noise_multiplier = calibrate_noise_multiplier(
        dp.calibrate_epsilon, dp.delta, cfg.rounds, "fixed" if uniform else "poisson",
        sampling_rate=cfg.sampling.rate, population=num_clients, cohort_size=cfg.sampling.cohort_size,
        kind=dp.accountant)


def sample_cohort(cfg, num_clients: int, generator: np.random.Generator, eligible=None) -> np.ndarray:
    if cfg.sampling.method == "uniform":
        return sampling.uniform(num_clients, cfg.sampling.cohort_size, generator, eligible)
    return sampling.poisson(num_clients, cfg.sampling.rate, generator, eligible)


def poisson_slots(rate: float, num_clients: int, drawn: int) -> int:
    """Fixed cohort capacity for Poisson rounds: mean + 4 sd, rounded up to a multiple of 8."""
    base = rate * num_clients + 4 * math.sqrt(num_clients * rate * (1 - rate))
    return max(8, 8 * math.ceil(max(base, drawn) / 8))


STALL_ROUNDS = 3  # rounds in a row with every client update non-finite before the run stops


@dataclasses.dataclass
class LoopState:
    """What the loop carries from round to round besides the server state (all of it checkpointed)."""

    rate_reference: object
    host_rng: np.random.Generator
    client_updates: int = 0
    rounds_run: int = 0
    best: list = dataclasses.field(default_factory=lambda: [-1.0, -1])
    last_eval: dict = dataclasses.field(default_factory=dict)
    participation: list = dataclasses.field(default_factory=list)  # [round, client ids] per round run
    all_dropped_streak: int = 0  # consecutive rounds in which every client update was non-finite
    meter: TrafficMeter = dataclasses.field(default_factory=TrafficMeter)
    client_states: ClientStateStore | None = None  # per-client algorithm state (SCAFFOLD's c_i)

    def save(self, checkpointer: Checkpointer, state) -> None:
        trees = {"state": state, "rate_reference": self.rate_reference}
        state_ids, stacked = self.client_states.export() if self.client_states is not None else ([], None)
        if state_ids:
            trees["client_states"] = stacked
        checkpointer.save(self.rounds_run, trees, {
            "host_rng": self.host_rng.bit_generator.state, "client_updates": self.client_updates,
            "best": self.best, "last_eval": self.last_eval, "participation": self.participation,
            "uplink": self.meter.uplink, "downlink": self.meter.downlink, "all_dropped_streak": self.all_dropped_streak,
            "client_state_ids": state_ids})

    def restore(self, checkpointer: Checkpointer, state, tracker, workdir: str):
        """Loads the newest checkpoint into this loop state; returns the server state. The privacy
        tracker replays the recorded participations (never reset, never counted twice)."""
        def targets(saved):
            trees = {"state": state, "rate_reference": self.rate_reference}
            if saved.get("client_state_ids"):
                trees["client_states"] = self.client_states.template_stack(len(saved["client_state_ids"]))
            return trees

        restored = checkpointer.restore_latest(targets)
        if restored is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {checkpointer.directory}")
        trees, saved = restored
        if self.client_states is not None:
            self.client_states.load(saved.get("client_state_ids", []), trees.get("client_states"))
        self.rate_reference, self.rounds_run = trees["rate_reference"], saved["round"]
        self.host_rng.bit_generator.state = saved["host_rng"]
        self.client_updates, self.best, self.last_eval = saved["client_updates"], saved["best"], saved["last_eval"]
        self.participation, self.all_dropped_streak = saved["participation"], saved["all_dropped_streak"]
        self.meter = TrafficMeter(saved["uplink"], saved["downlink"])
        if tracker is not None:
            for t, ids in self.participation:
                tracker.record(t, np.asarray(ids, dtype=np.int64))
        truncate_metrics(os.path.join(workdir, "metrics.jsonl"), self.rounds_run)
        return trees["state"]


def make_packer(cfg, dataset, algorithm):
    """``pack(ids, rng, slots) -> cohort`` with step counts fixed for the whole run (one compiled
    program); UGA cohorts also carry each client's whole data for the gradient evaluation."""
    largest, batch, epochs = int(dataset.train_sizes().max()), cfg.client.batch_size, cfg.client.epochs
    indices = lambda ids: [dataset.client_train[i] for i in ids]  # noqa: E731
    if not algorithm.needs_evaluation_pass:
        max_steps = num_steps(largest, batch, epochs)
        return lambda ids, rng, slots: pack_cohort(dataset.x, dataset.y, indices(ids), batch, epochs, rng,
                                                   max_steps, slots)
    eval_batch = cfg.uga.eval_batch_size or batch
    max_steps, max_eval = max(1, num_steps(largest, batch, epochs - 1)), num_steps(largest, eval_batch, 1)
    return lambda ids, rng, slots: pack_uga_cohort(dataset.x, dataset.y, indices(ids), batch, epochs, rng,
                                                   max_steps, slots, eval_batch, max_eval)


def run_experiment(cfg, workdir: str, overwrite: bool = False, progress: bool = True,
                   resume: bool = False) -> RunSummary:
    """Runs one configured experiment and writes its results directory.

    ``resume`` continues the run in ``workdir`` from its newest checkpoint (``checkpointing``): the
    result is identical to an uninterrupted run with the same config. SIGINT / SIGTERM finish the
    current round, write a checkpoint and return a summary marked ``interrupted``.
    """
    validate_config(cfg)
    start = time.perf_counter()
    dataset = build_dataset(cfg.data, cfg.seed)
    server_set = build_server_set(cfg.data, cfg.server_data, dataset, cfg.seed) if needs_server_set(cfg) else None
    if cfg.algorithm == "fedshare":
        dataset = share_with_clients(dataset, server_set)
    if cfg.sampling.method == "uniform" and cfg.sampling.cohort_size > dataset.num_clients:
        raise ValueError(f"cohort_size={cfg.sampling.cohort_size} exceeds the population of {dataset.num_clients} clients")
    cfg = cfg.copy_and_resolve_references()
    calibrate_if_asked(cfg, dataset.num_clients)
    choice = resolve_engine(cfg, get_model(cfg.model.name).has_conv, int(expected_cohort(cfg, dataset.num_clients)))
    model = get_model(cfg.model.name, dataset.example_shape, dataset.num_classes, conv_impl=choice.conv_impl)
    build = lambda compressor=None: build_algorithm(cfg, model, choice, dataset.num_clients, server_set,  # noqa: E731
                                                    compressor)
    compression = CompressionControl(cfg.compression, build) if cfg.compression.enabled else None
    algorithm = build()
    pack = make_packer(cfg, dataset, algorithm)
    tracker = None
    if cfg.algorithm in DP_ALGORITHMS:
        tracker = PrivacyTracker(cfg.dp, cfg.sampling.method, dataset.num_clients, cfg.sampling.cohort_size,
                                 cfg.sampling.rate, algorithm.private, cfg.dp.clip)
    root = jax.random.key(cfg.seed)
    state = algorithm.init(model.init(rng_lib.purpose_key(root, rng_lib.Purpose.EVALUATION)))
    loop = LoopState(rate_reference=state.params, host_rng=np.random.default_rng(cfg.seed + 1))
    if hasattr(algorithm, "client_state_template"):
        loop.client_states = ClientStateStore(algorithm.client_state_template(state.params))
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"))
    if resume:
        state = loop.restore(checkpointer, state, tracker, workdir)
    writer = results.ResultsWriter(workdir, cfg.to_json_best_effort(indent=2), overwrite, append=resume)

    interruption, stop_reason = Interruption(), None
    bar = tqdm(range(loop.rounds_run + 1, cfg.rounds + 1), disable=not progress, desc=cfg.algorithm, unit="round",
               initial=loop.rounds_run, total=cfg.rounds)
    with interruption.installed():
        for t in bar:
            if tracker is not None and not tracker.allows(t):
                tracker.stopped_at, stop_reason = t, "privacy budget"
                break
            eligible = tracker.eligible(t) if tracker is not None else None
            if eligible is not None and cfg.sampling.method == "uniform" and eligible.sum() < cfg.sampling.cohort_size:
                tracker.stopped_at, stop_reason = t, "privacy budget"
                break
            ids = sample_cohort(cfg, dataset.num_clients, loop.host_rng, eligible)
            row = {"round": t, "cohort_size": len(ids)}
            slots = poisson_slots(cfg.sampling.rate, dataset.num_clients, len(ids)) if cfg.sampling.method == "poisson" else None
            if len(ids) or tracker is not None:
                cohort = pack(ids, loop.host_rng, slots)
                if loop.client_states is not None:
                    cohort[CLIENT_STATE_KEY] = loop.client_states.gather(ids, cohort["mask"].shape[0])
                key = rng_lib.round_key(root, t)
                if compression is not None:
                    algorithm = compression.algorithm_for(loop.rate_reference)
                previous = state
                if tracker is not None:
                    state, metrics = algorithm.round(state, cohort, key, tracker.noise_multiplier(t))
                else:
                    state, metrics = algorithm.round(state, cohort, key)
                if tracker is not None:  # accounted even if the result is discarded below (conservative)
                    tracker.record(t, ids)
                    row["epsilon"] = tracker.epsilon()
                loop.participation.append([t, [int(i) for i in ids]])
                if not bool(tree.is_finite(state.params)):
                    state, stop_reason = previous, f"the global model diverged in round {t} (non-finite parameters)"
                    writer.log({**row, "diverged": True})
                    break
                dropped = np.asarray(metrics.pop("client_dropped", np.zeros(len(ids), bool)))[:len(ids)]
                new_client_states = metrics.pop(CLIENT_STATE_KEY, None)
                if loop.client_states is not None:  # a dropped client keeps its old state
                    loop.client_states.scatter(ids, new_client_states, ~dropped)
                if dropped.any():  # non-finite updates: kept out of the model, counted, and named
                    row["dropped_client_ids"] = [int(i) for i in np.asarray(ids)[dropped]]
                    logging.warning("round %d: dropped non-finite updates of clients %s", t, row["dropped_client_ids"])
                row.update({k: float(v) for k, v in metrics.items()})
                loop.all_dropped_streak = loop.all_dropped_streak + 1 if len(ids) and dropped.all() else 0
                if loop.all_dropped_streak >= STALL_ROUNDS:
                    stop_reason = (f"every client update was non-finite for {STALL_ROUNDS} rounds in a row (to round "
                                   f"{t}): the global model has diverged")
                row.update(loop.meter.record(len(ids), algorithm.upload_bytes(state.params),
                                             dense_upload_bytes(state.params)))
                if compression is not None:
                    loop.rate_reference = jax.tree_util.tree_map(lambda a, b: a - b, state.params, previous.params)
                    row["compression_rates"] = [float(r) for r in jax.tree_util.tree_leaves(compression.rates)]
                loop.client_updates += len(ids)
            loop.rounds_run = t
            if t % cfg.eval_every == 0 or t == cfg.rounds:
                loop.last_eval = evaluate(model, state.params, dataset)
                row.update(loop.last_eval)
                if loop.last_eval["test_accuracy"] > loop.best[0]:
                    loop.best = [loop.last_eval["test_accuracy"], t]
                postfix = {"acc": f"{loop.last_eval['test_accuracy']:.4f}", "loss": f"{row.get('train_loss', float('nan')):.4f}"}
                if tracker is not None:
                    postfix["eps"] = f"{row['epsilon']:.3f}"
                bar.set_postfix(postfix)
            row["client_updates"] = loop.client_updates
            writer.log(row)
            if stop_reason:
                break
            if interruption:
                stop_reason = f"interrupted by {interruption.signal_name}"
                break
            if cfg.checkpoint_every and t % cfg.checkpoint_every == 0:
                loop.save(checkpointer, state)
    bar.close()
    if loop.rounds_run:
        loop.save(checkpointer, state)  # at exit; a diverged model is never saved (state is the last good one)
    interrupted = bool(interruption)
    if not interrupted and loop.rounds_run and loop.rounds_run % cfg.eval_every and loop.rounds_run != cfg.rounds:
        loop.last_eval = evaluate(model, state.params, dataset)  # the model training stopped at
        if loop.last_eval["test_accuracy"] > loop.best[0]:
            loop.best = [loop.last_eval["test_accuracy"], loop.rounds_run]
        writer.log({"round": loop.rounds_run, "final_evaluation": True, **loop.last_eval})
    writer.close()

    summary = RunSummary(workdir, loop.rounds_run, loop.last_eval, loop.best[0], loop.best[1], loop.client_updates,
                         time.perf_counter() - start, uplink_gb=loop.meter.uplink / 1e9,
                         traffic_gb=(loop.meter.uplink + loop.meter.downlink) / 1e9, stop_reason=stop_reason,
                         interrupted=interrupted)
    writer.write_json("privacy.json", privacy_record(cfg, tracker))
    if tracker is not None:
        summary.epsilon, summary.stopped_early = tracker.report().epsilon, tracker.stopped_at is not None
    writer.write_json("summary.json", {**dataclasses.asdict(summary),
                                       "engine": dataclasses.asdict(choice), "backend": jax.default_backend()})
    results.plot_accuracy(results.read_metrics(workdir), os.path.join(workdir, "accuracy.png"),
                          f"{cfg.algorithm} on {dataset.name}")
    return summary


def privacy_record(cfg, tracker) -> dict:
    """What ``privacy.json`` holds: the accountant's report, or for a non-private algorithm an
    explicit epsilon of infinity (every run records what it spent)."""
    notes = [META_DATA_NOTE] if cfg.fedmeta.enabled else []
    if cfg.algorithm == "fedshare":
        notes.append("FedShare distributes the shared set to every client: those examples are public to all clients")
    if tracker is None:
        return {"mechanism": "none", "epsilon": math.inf, "formal": False,
                "notes": [f"{cfg.algorithm} adds no noise: no differential privacy (epsilon unbounded)"] + notes}
    record = dataclasses.asdict(tracker.report())
    record["notes"] = record["notes"] + notes
    return record


def format_summary(summary: RunSummary) -> str:
    """The table printed at the end of a run."""
    lines = [
        f"{'workdir':<22}{summary.workdir}",
        f"{'rounds':<22}{summary.rounds}" + (f"  (stopped: {summary.stop_reason})" if summary.stop_reason else ""),
        f"{'client updates (CC)':<22}{summary.client_updates}",
        f"{'best accuracy':<22}{summary.best_accuracy:.4f} (round {summary.best_round})",
        f"{'traffic (GB)':<22}{summary.uplink_gb:.4f} up, {summary.traffic_gb:.4f} total",
    ]
    lines += [f"{'final ' + k:<22}{v:.4f}" for k, v in summary.final.items()]
    if summary.epsilon is not None:
        lines.append(f"{'epsilon spent':<22}{summary.epsilon:.4f}")
    lines.append(f"{'wall time':<22}{summary.seconds:.1f} s")
    return "\n".join(lines)
