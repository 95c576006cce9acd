"""The experiment loop: per round sample, pack, train, aggregate; evaluate every k rounds; log."""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core import rng as rng_lib
from fedjax_dp.core.cohort import client_mesh
from fedjax_dp.core.strategy import StrategyChoice, choose_strategy
from fedjax_dp.data import sampling
from fedjax_dp.data.builders import build_dataset
from fedjax_dp.data.packing import num_steps, pack_cohort
from fedjax_dp.models import get_model
from fedjax_dp.training import results
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.evaluation import evaluate
from fedjax_dp.training.optimizers import build_optimizer

ALGORITHMS = ("fedavg",)


@dataclasses.dataclass
class RunSummary:
    workdir: str
    rounds: int
    final: dict
    best_accuracy: float
    best_round: int
    client_updates: int
    seconds: float


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


def build_algorithm(cfg, model, choice: StrategyChoice):
    if cfg.algorithm != "fedavg":
        raise ValueError(f"unknown algorithm {cfg.algorithm!r}; available: {ALGORITHMS}")
    mesh = client_mesh(cfg.engine.num_devices or None) if cfg.engine.num_devices else None
    return FedAvg(
        per_example_loss=model.per_example_loss,
        client_optimizer=build_optimizer(cfg.client.optimizer, cfg.client.learning_rate, cfg.client.momentum),
        server_optimizer=build_optimizer(cfg.server.optimizer, cfg.server.learning_rate, cfg.server.momentum),
        strategy=choice.strategy, chunk_size=choice.chunk_size, unroll=choice.unroll, mesh=mesh,
    )


def sample_cohort(cfg, num_clients: int, generator: np.random.Generator) -> np.ndarray:
    if cfg.sampling.method == "uniform":
        return sampling.uniform(num_clients, cfg.sampling.cohort_size, generator)
    return sampling.poisson(num_clients, cfg.sampling.rate, generator)


def run_experiment(cfg, workdir: str, overwrite: bool = False, progress: bool = True) -> RunSummary:
    """Runs one configured experiment and writes its results directory."""
    validate_config(cfg)
    start = time.perf_counter()
    dataset = build_dataset(cfg.data, cfg.seed)
    if cfg.sampling.method == "uniform" and cfg.sampling.cohort_size > dataset.num_clients:
        raise ValueError(f"cohort_size={cfg.sampling.cohort_size} exceeds the population of {dataset.num_clients} clients")
    expected_cohort = cfg.sampling.cohort_size if cfg.sampling.method == "uniform" else max(1, round(cfg.sampling.rate * dataset.num_clients))
    choice = resolve_engine(cfg, cfg.model.name.startswith("cnn"), expected_cohort)
    model = get_model(cfg.model.name, dataset.example_shape, dataset.num_classes, conv_impl=choice.conv_impl)
    algorithm = build_algorithm(cfg, model, choice)
    writer = results.ResultsWriter(workdir, cfg.to_json_best_effort(indent=2), overwrite)

    root = jax.random.key(cfg.seed)
    state = algorithm.init(model.init(rng_lib.purpose_key(root, rng_lib.Purpose.EVALUATION)))
    host_rng = np.random.default_rng(cfg.seed + 1)
    max_steps = num_steps(int(dataset.train_sizes().max()), cfg.client.batch_size, cfg.client.epochs)
    client_updates, best, last_eval = 0, (-1.0, -1), {}
    bar = tqdm(range(1, cfg.rounds + 1), disable=not progress, desc=cfg.algorithm, unit="round")
    for t in bar:
        ids = sample_cohort(cfg, dataset.num_clients, host_rng)
        row = {"round": t, "cohort_size": len(ids)}
        if len(ids):
            cohort = pack_cohort(dataset.x, dataset.y, [dataset.client_train[i] for i in ids],
                                 cfg.client.batch_size, cfg.client.epochs, host_rng, max_steps)
            state, metrics = algorithm.round(state, cohort, rng_lib.round_key(root, t))
            row.update({k: float(v) for k, v in metrics.items()})
            client_updates += len(ids)
        if t % cfg.eval_every == 0 or t == cfg.rounds:
            last_eval = evaluate(model, state.params, dataset)
            row.update(last_eval)
            if last_eval["test_accuracy"] > best[0]:
                best = (last_eval["test_accuracy"], t)
            bar.set_postfix(acc=f"{last_eval['test_accuracy']:.4f}", loss=f"{row.get('train_loss', float('nan')):.4f}")
        row["client_updates"] = client_updates
        writer.log(row)
    writer.close()

    summary = RunSummary(workdir, cfg.rounds, last_eval, best[0], best[1], client_updates, time.perf_counter() - start)
    writer.write_json("summary.json", {**dataclasses.asdict(summary),
                                       "engine": dataclasses.asdict(choice), "backend": jax.default_backend()})
    results.plot_accuracy(results.read_metrics(workdir), os.path.join(workdir, "accuracy.png"),
                          f"{cfg.algorithm} on {dataset.name}")
    return summary


def format_summary(summary: RunSummary) -> str:
    """The table printed at the end of a run."""
    lines = [
        f"{'workdir':<22}{summary.workdir}",
        f"{'rounds':<22}{summary.rounds}",
        f"{'client updates (CC)':<22}{summary.client_updates}",
        f"{'best accuracy':<22}{summary.best_accuracy:.4f} (round {summary.best_round})",
    ]
    lines += [f"{'final ' + k:<22}{v:.4f}" for k, v in summary.final.items()]
    lines.append(f"{'wall time':<22}{summary.seconds:.1f} s")
    return "\n".join(lines)
