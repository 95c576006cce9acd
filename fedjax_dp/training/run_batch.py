"""Runs that differ only in their seed, in lockstep through one vmapped round program (issue 89,
"runs in one program").

Each run keeps everything of its own: its ``RunContext`` (data, tracker, loop state, workdir,
results writer, checkpoints) and its callbacks (evaluation, results, plots). Only the training of
each round is shared: every run plans round t on the host (``RunContext.plan_round``: the budget
check, its own cohort drawn from its own generator and packed, its keys), the cohorts and server
states are stacked on a new leading run axis, and one program, ``jax.jit(jax.vmap(f))`` of the
round as a traced function (``FederatedRound.traced_round``: the cohort engine's own strategy
inside, the server step after it), trains every run at once; each run then finishes its round
(``RunContext.finish_round``: composes its releases, keeps its state, writes its row).

The numbers are each run's own up to float32 rounding: vmapping over runs batches the same
operations (a matmul becomes a batched matmul), which may sum in another order. The epsilons are
equal (the same host-side cohorts and events). Memory: about S times one run's cohort and server
state on the device at once; where S packed cohorts would exceed ``MEMORY_FRACTION`` of this
machine's memory, or a run's configuration cannot join (``refusal``), the runs go one after
another instead (logged). The program is compiled once for the batch, not once per run. Where this
process has several devices (XLA:CPU's host devices, one a core) that divide the number of runs,
the run axis is split over them: each device trains its share of the runs.

Refused (one after another instead): per-client state (SCAFFOLD, error feedback), a cohort-level
transform (Geyer's median clip), canaries, an algorithm that adapts its settings after the round
(``hypergrad``), the ``loop`` strategy or several devices, and several processes. A round whose
cohorts differ in shape between runs (a Poisson cohort above the packed capacity) runs its runs one
after another. Not resumable as a batch: a resumed seed runs alone.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_dp.core import hosts
from fedjax_dp.core.round import RoundResult
from fedjax_dp.training import results
from fedjax_dp.training.callbacks import default_callbacks
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.loop import after_round
from fedjax_dp.training.run_context import RoundPlan, RunContext
from fedjax_dp.training.workdir_lock import held_by_process_zero

MEMORY_FRACTION = 0.5
"""The share of physical memory S stacked cohorts may take before the runs go one by one."""


def refusal(run: RunContext) -> str | None:
    """Why ``run`` cannot train in a batch (module docstring), or None."""
    runner = run.runner
    requirements = runner.algorithm.requirements
    reasons = (
        (hosts.distributed(), "several processes"),
        (requirements.client_state, "the algorithm keeps per-client state"),
        (runner.uploads.keeps_client_state, "an upload transform keeps per-client state"),
        (runner.uploads.split < len(runner.uploads), "a cohort-level transform"),
        (run.audit is not None, "canary clients (audit.canaries)"),
        (hasattr(runner.algorithm, "adapt_settings"), "settings adapted after each round"),
        (run.cfg.engine.stream_clients, "a streamed cohort (engine.stream_clients)"),
        (run.resumed, "a resumed run"),
    )
    found = next((why for bad, why in reasons if bad), None)
    if found is not None:
        return found
    try:
        runner.traced_round(runner.specialized(run.state))
    except ValueError as error:
        return str(error)
    return None


def run_batched(cfgs, workdirs, overwrite: bool = False) -> list:
    """Trains the runs of ``cfgs`` (equal but for their ``seed``) in lockstep (module docstring),
    each into its workdir; returns their ``RunSummary``s. Where they cannot be batched they run one
    after another (``training.loop.run_experiment``), with the reason logged."""
    if len(cfgs) != len(workdirs):
        raise ValueError(f"{len(cfgs)} configs for {len(workdirs)} workdirs")
    _check_seeds_only(cfgs)
    with contextlib.ExitStack() as held:
        for workdir in workdirs:
            held.enter_context(held_by_process_zero(workdir))
        for cfg in cfgs:
            validate_config(cfg)
        runs = [RunContext.prepare(c, w, overwrite, False, False) for c, w in zip(cfgs, workdirs)]
        reason = next((r for r in map(refusal, runs) if r is not None), None)
        callbacks = [default_callbacks(run.cfg, "off") for run in runs]
        for run, hooks in zip(runs, callbacks):
            for callback in hooks:
                callback.on_train_begin(run)
        if reason is not None:
            logging.warning("runs one after another, not batched: %s", reason)
        for run in runs:
            held.enter_context(run.interruption.installed())
        _lockstep(runs, callbacks, batched=reason is None)
        for run, hooks in zip(runs, callbacks):
            results.attempt_each([functools.partial(c.on_train_end, run) for c in hooks])
    return [run.summary for run in runs]


def _check_seeds_only(cfgs) -> None:
    def without_seed(cfg):
        one = cfg.copy_and_resolve_references()
        one.seed = 0
        return one.to_json_best_effort()

    first = without_seed(cfgs[0])
    for i, cfg in enumerate(cfgs[1:], 1):
        if without_seed(cfg) != first:
            raise ValueError(
                f"batched runs differ only in their seed; config {i} differs from config 0 in"
                " another key"
            )


def _lockstep(runs, callbacks, batched: bool) -> None:
    active = list(range(len(runs)))
    programs: dict = {}
    fits_checked = False
    rounds = runs[0].cfg.rounds
    for t in range(1, rounds + 1):
        if not active:
            break
        plans = {i: runs[i].plan_round(t) for i in active}
        rows = {i: None for i, plan in plans.items() if plan is None}
        for i, plan in plans.items():
            if plan is not None and plan.cohort is None:
                runs[i].loop.rounds_run = t
                rows[i] = plan.row
        training = [i for i, plan in plans.items() if plan is not None and plan.cohort is not None]
        if batched and len(training) > 1 and not fits_checked:
            # the cohorts' capacity is fixed for the run: one check, on the first batch
            batched, fits_checked = _fits(plans, training), True
        if batched and len(training) > 1:
            rows.update(_train_together(runs, plans, training, programs))
        else:
            for i in training:
                result, settings_row = runs[i].execute(plans[i])
                rows[i] = runs[i].finish_round(plans[i], result, settings_row)
        signalled = next((runs[i].interruption for i in active if runs[i].interruption), None)
        for i in list(active):
            run = runs[i]
            if signalled is not None and not run.interruption:
                run.interruption.signal_name = signalled.signal_name
                run.interruption.event.set()
            if after_round(run, t, rows[i], callbacks[i]):
                active.remove(i)


def _fits(plans, training) -> bool:
    """Whether the stacked cohorts fit in ``MEMORY_FRACTION`` of the physical memory."""
    one = sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(plans[training[0]].cohort))
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return True
    if one * len(training) > MEMORY_FRACTION * memory:
        logging.warning(
            "%d stacked cohorts need %.1f GB: the runs go one after another",
            len(training),
            one * len(training) / 1e9,
        )
        return False
    return True


def _train_together(runs, plans, training, programs) -> dict:
    """Round t of the runs ``training`` as one vmapped program; their rows. Runs whose chains or
    cohorts differ in shape from the first's train one after another."""
    groups: dict = {}
    for i in training:
        plan = plans[i]
        _, args = runs[i].runner.function(runs[i].state, plan.cohort, plan.key, **plan.inputs)
        signature = (
            plan.inputs["uploads"].static_key(),
            jax.tree_util.tree_structure(args),
            tuple(np.shape(x) for x in jax.tree_util.tree_leaves(args)),
        )
        groups.setdefault(signature, []).append((i, args))
    rows = {}
    for signature, members in groups.items():
        if len(members) == 1:
            ((i, _),) = members
            result, settings_row = runs[i].execute(plans[i])
            rows[i] = runs[i].finish_round(plans[i], result, settings_row)
            continue
        first = runs[members[0][0]]
        uploads = plans[members[0][0]].inputs["uploads"]
        if signature[0] not in programs:
            f = first.runner.traced_round(uploads)
            programs[signature[0]] = jax.jit(jax.vmap(f, in_axes=(0, 0, 0, 0, None)))
        states = _stack([runs[i].state for i, _ in members])
        clients, keys, noise_keys, inputs = (
            _stack([a[0] for _, a in members]),
            _stack([a[1] for _, a in members]),
            _stack([a[2] for _, a in members]),
            members[0][1][3],
        )
        batch = _spread((states, clients, keys, noise_keys), len(members))
        new_states, metrics, finite, released = programs[signature[0]](*batch, inputs)
        each = _unstacked(len(members))((new_states, released))  # one program, not a gather a leaf
        metrics, finite = jax.device_get((metrics, finite))
        first = jax.local_devices()[0]  # where a run's state lives between rounds
        for b, (i, _) in enumerate(members):
            state, run_released = jax.device_put(each[b], first)
            run_metrics = {k: v[b] for k, v in metrics.items()}
            rows[i] = _finish(runs[i], plans[i], state, run_metrics, finite[b], run_released)
    return rows


@functools.lru_cache(maxsize=16)
def _unstacked(runs: int):
    return jax.jit(
        lambda tree: tuple(jax.tree_util.tree_map(lambda x: x[b], tree) for b in range(runs))
    )


def _spread(batched, runs: int):
    """The run axis split over this process's devices where they divide it (XLA:CPU's host
    devices are its cores: each trains its share of the runs), else as it is."""
    devices = jax.local_devices()
    if len(devices) < 2 or runs % len(devices):
        return batched
    mesh = Mesh(np.array(devices), ("runs",))
    return jax.device_put(batched, NamedSharding(mesh, PartitionSpec("runs")))


def _finish(run: RunContext, plan: RoundPlan, state, metrics, finite, released) -> dict:
    present = np.asarray(plan.cohort["num_examples"]) > 0
    dropped = present & ~np.asarray(finite)
    result = RoundResult(
        state,
        {**metrics, "dropped_clients": int(dropped.sum())},
        dropped,
        None,
        None,
        plan.inputs["uploads"].releases(plan.t, run.state.uploads),
        released,
    )
    return run.finish_round(plan, result, {})


def _stack(trees):
    """The trees stacked on a new leading axis: host arrays on the host (one transfer each later,
    ``_spread``), device arrays (states, keys) on the device."""

    def stack(*leaves):
        if all(isinstance(x, np.ndarray) for x in leaves):
            return np.stack(leaves)
        return jnp.stack(leaves)

    return jax.tree_util.tree_map(stack, *trees)
