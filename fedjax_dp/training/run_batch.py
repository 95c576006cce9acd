"""Runs that differ only in their seed and scalar settings (``BATCHABLE_KEYS``), in lockstep
through one vmapped round program (issue 89, "runs in one program").

Each run keeps everything of its own: its ``RunContext`` (data, tracker, loop state, workdir,
results writer, checkpoints) and its callbacks (evaluation, results, plots). Only the training of
each round is shared: every run plans round t on the host (``RunContext.plan_round``: the budget
check, its own cohort drawn from its own generator and packed, its keys), the cohorts and server
states are stacked on a new leading run axis, and one program, ``jax.jit(jax.vmap(f))`` of the
round as a traced function (``FederatedRound.traced_round``: the cohort engine's own strategy
inside, the server step after it), trains every run at once; each run then finishes its round
(``RunContext.finish_round``: composes its releases, keeps its state, writes its row).

Scalar settings enter the one program as traced per-run values: the chain's per-round inputs (the
noise multiplier z_t) and the numbers among its transforms' ``RunVarying`` fields (the clip norm)
are stacked per run; client and server learning rates become factors lr_i / lr_1 on the first run's
(``hypergrad.Hypertuned``'s log-multipliers, held in the state for the round). Every other
constant of the chain must agree between runs sharing a program (``core.uploads.program_fields``):
runs whose chains differ elsewhere form groups of their own.

The numbers are each run's own up to float32 rounding: vmapping over runs batches the same
operations (a matmul becomes a batched matmul), which may sum in another order. The epsilons are
equal (the same host-side cohorts and events). Memory: about S times one run's cohort and server
state on the device at once; where S packed cohorts would exceed ``MEMORY_FRACTION`` of this
machine's memory, or a run's configuration cannot join (``refusal``), the runs go one after
another instead (logged). The program is compiled once for the batch, not once per run. Where this
process has several devices (XLA:CPU's host devices, one a core) that divide the number of runs,
the run axis is split over them: each device trains its share of the runs.

Refused (one after another instead): scalar settings other than the seed for an algorithm whose
registry entry does not declare ``scaled_rates`` (its settings may be constants of its own),
per-client state (SCAFFOLD, error feedback), a cohort-level transform (Geyer's median clip),
canaries, an algorithm that adapts its settings after the round (``hypergrad``), the ``loop``
strategy or several devices, and several processes. A round whose cohorts differ in shape between
runs (a Poisson cohort above the packed capacity) runs its runs one after another. Not resumable as
a batch: a resumed run runs alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_dp import configs
from fedjax_dp.algorithms import registry
from fedjax_dp.core import hosts
from fedjax_dp.core.round import RoundResult
from fedjax_dp.core.uploads import program_fields, varying_inputs
from fedjax_dp.hypergrad.differentiable import Hypertuned, initial_settings
from fedjax_dp.training import results
from fedjax_dp.training.callbacks import default_callbacks
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.loop import after_round
from fedjax_dp.training.run_context import RoundPlan, RunContext
from fedjax_dp.training.workdir_lock import held_by_process_zero

MEMORY_FRACTION = 0.5
"""The share of physical memory S stacked cohorts may take before the runs go one by one."""

BATCHABLE_KEYS = (
    "seed",
    "client.learning_rate",
    "server.learning_rate",
    "dp.clip_norm",
    "dp.noise_multiplier",
    "privacy.target_epsilon",
)
"""The config keys runs batched in one program may differ in (module docstring)."""


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


def run_batched(cfgs, workdirs, overwrite: bool = False, extra_callbacks=None) -> list:
    """Trains the runs of ``cfgs`` (equal but for ``BATCHABLE_KEYS``) in lockstep (module
    docstring), each into its workdir; returns their ``RunSummary``s. Where they cannot be batched
    they run one after another (``training.loop.run_experiment``), with the reason logged.
    ``extra_callbacks``: per run, callbacks beside the loop's own (``default_callbacks``' extra)."""
    if len(cfgs) != len(workdirs):
        raise ValueError(f"{len(cfgs)} configs for {len(workdirs)} workdirs")
    extra_callbacks = extra_callbacks or [()] * len(cfgs)
    varied = check_batchable(cfgs)
    with contextlib.ExitStack() as held:
        for workdir in workdirs:
            held.enter_context(held_by_process_zero(workdir))
        for cfg in cfgs:
            validate_config(cfg)
        runs = [RunContext.prepare(c, w, overwrite, False, False) for c, w in zip(cfgs, workdirs)]
        reason = next((r for r in map(refusal, runs) if r is not None), None)
        traced = registry.with_scaled_rates()
        if reason is None and varied and cfgs[0].algorithm not in traced:
            reason = (
                f"the runs differ in {varied[0]}, which {cfgs[0].algorithm} does not take as a"
                f" traced input (batched: the seed alone, or {', '.join(traced)})"
            )
        callbacks = [default_callbacks(run.cfg, "off", e) for run, e in zip(runs, extra_callbacks)]
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


def check_batchable(cfgs) -> list[str]:
    """The ``BATCHABLE_KEYS`` the configs differ in; a ``ValueError`` naming the first other key
    that differs."""
    flat = [_by_key(c.copy_and_resolve_references()) for c in cfgs]
    for i, one in enumerate(flat[1:], 1):
        keys = sorted(set(one) | set(flat[0]))
        differ = (k for k in keys if repr(one.get(k)) != repr(flat[0].get(k)))
        other = next((k for k in differ if k not in BATCHABLE_KEYS), None)
        if other is not None:
            raise ValueError(
                f"batched runs differ only in {', '.join(BATCHABLE_KEYS)}; config {i} differs"
                f" from config 0 in {other}: {one.get(other)!r} against {flat[0].get(other)!r}"
            )
    return [k for k in BATCHABLE_KEYS[1:] if len({repr(f.get(k)) for f in flat}) > 1]


def _by_key(cfg) -> dict:
    """Every leaf of ``cfg`` by its dotted key (``configs.all_keys``)."""
    at = lambda key: functools.reduce(lambda c, part: c[part], key.split("."), cfg)  # noqa: E731
    return {key: at(key) for key in configs.all_keys(cfg)}


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
    cohorts differ from the first's (in shape, or in a constant of the program) train apart."""
    groups: list = []  # (signature, chain, members)
    for i in training:
        plan = plans[i]
        uploads = plan.inputs["uploads"]
        _, args = runs[i].runner.function(runs[i].state, plan.cohort, plan.key, **plan.inputs)
        clients, key, noise_key, inputs = args
        inputs = tuple({**x, **_traced(varying_inputs(t))} for x, t in zip(inputs, uploads))
        args = (clients, key, noise_key, inputs)
        signature = (
            uploads.static_key(),
            jax.tree_util.tree_structure(args),
            tuple(np.shape(x) for x in jax.tree_util.tree_leaves(args)),
        )
        group = next(
            (g for g in groups if g[0] == signature and _same_program(g[1], uploads)), None
        )
        if group is None:
            groups.append((signature, uploads, [(i, args)]))
        else:
            group[2].append((i, args))
    rows = {}
    for signature, uploads, members in groups:
        if len(members) == 1:
            ((i, _),) = members
            result, settings_row = runs[i].execute(plans[i])
            rows[i] = runs[i].finish_round(plans[i], result, settings_row)
            continue
        leaves, treedef = jax.tree_util.tree_flatten(members[0][1][3])
        scalar = tuple(np.ndim(x) == 0 for x in leaves)
        program, rates = _program_for(programs, runs, members, signature, uploads, treedef, scalar)
        states = _stack([runs[i].state for i, _ in members])
        clients, keys, noise_keys = (_stack([a[k] for _, a in members]) for k in range(3))
        each_leaves = [jax.tree_util.tree_leaves(a[3]) for _, a in members]
        per_run = tuple(
            jnp.stack([one[j] for one in each_leaves]) for j, s in enumerate(scalar) if s
        )
        fixed = tuple(x for x, s in zip(leaves, scalar) if not s)
        batch = _spread((states, clients, keys, noise_keys, per_run, rates), len(members))
        new_states, metrics, finite, released = program(*batch, fixed)
        each = _unstacked(len(members))((new_states, released))  # one program, not a gather a leaf
        metrics, finite = jax.device_get((metrics, finite))
        first = jax.local_devices()[0]  # where a run's state lives between rounds
        for b, (i, _) in enumerate(members):
            state, run_released = jax.device_put(each[b], first)
            run_metrics = {k: v[b] for k, v in metrics.items()}
            rows[i] = _finish(runs[i], plans[i], state, run_metrics, finite[b], run_released)
    return rows


def _program_for(programs: dict, runs, members, signature, uploads, treedef, scalar: tuple):
    """``(program, rates)`` for the group ``members``: a compiled program of a group with the same
    chain constants (and, where it does not trace the learning rates, the same rates), else a new
    one built from the group's first run; ``rates``: the program's per-run input (``_rates``,
    relative to the run it was built from)."""
    group_rates = [_learning_rates(runs[i].cfg) for i, _ in members]
    traced = len(set(group_rates)) > 1
    key = (signature[0], treedef, scalar, traced)
    for chain, reference, program in programs.get(key, []):
        if _same_program(chain, uploads) and (traced or reference == group_rates[0]):
            return program, _rates(group_rates, reference) if traced else None
    reference = group_rates[0]
    program = _program(runs[members[0][0]], uploads, treedef, scalar, traced)
    programs.setdefault(key, []).append((uploads, reference, program))
    return program, _rates(group_rates, reference) if traced else None


def _program(first: RunContext, uploads, treedef, scalar: tuple, traced_rates: bool):
    """``jit(vmap(f))`` of the round for runs like ``first``: ``f(state, clients, key, noise_key,
    per_run, rates, fixed)``, the chain's inputs rebuilt from the per-run scalars ``per_run`` and
    the shared arrays ``fixed``; with ``traced_rates``, the learning rates are factors ``rates`` on
    ``first``'s (``_rates``)."""
    runner = first.runner
    if traced_rates:
        base = dataclasses.replace(runner.algorithm, deferred_dense_rate=None)  # one scalar rate
        runner = runner.with_algorithm(Hypertuned(base, 1))
    f = runner.traced_round(uploads)

    def batched(state, clients, key, noise_key, per_run, rates, fixed):
        scalars, arrays = iter(per_run), iter(fixed)
        leaves = [next(scalars) if s else next(arrays) for s in scalar]
        inputs = jax.tree_util.tree_unflatten(treedef, leaves)
        if rates is not None:
            state = state.replace(extra=rates)
        new_state, metrics, finite, released = f(state, clients, key, noise_key, inputs)
        if rates is not None:
            new_state = new_state.replace(extra=None)
        return new_state, metrics, finite, released

    return jax.jit(jax.vmap(batched, in_axes=(0, 0, 0, 0, 0, 0, None)))


def _learning_rates(cfg) -> tuple:
    """A run's (client, server) learning rates."""
    return float(cfg.client.learning_rate), float(cfg.server.learning_rate)


def _rates(rates: list, reference: tuple):
    """Per run, ``Hypertuned``'s log-multipliers log(lr_i / lr_ref) of the (client, server) rates
    ``rates`` on those of the run a program was built from, stacked."""
    settings = []
    for client, server in rates:
        one = initial_settings(1)
        one["client_lr"] = jnp.float32(math.log(client / reference[0]))
        one["server_lr"] = jnp.float32(math.log(server / reference[1]))
        settings.append(one)
    return _stack(settings)


def _traced(values: dict) -> dict:
    return {k: jnp.float32(v) for k, v in values.items()}


def _same_program(a, b) -> bool:
    """Whether chains ``a`` and ``b`` agree in every constant of their programs
    (``core.uploads.program_fields``)."""
    return len(a) == len(b) and all(
        type(x) is type(y) and _same_value(program_fields(x), program_fields(y))
        for x, y in zip(a, b)
    )


def _same_value(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, (np.ndarray, jax.Array)) or isinstance(b, (np.ndarray, jax.Array)):
        return np.shape(a) == np.shape(b) and bool(np.array_equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(map(_same_value, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        names = [f.name for f in dataclasses.fields(a)]
        return all(_same_value(getattr(a, n), getattr(b, n)) for n in names)
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


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
