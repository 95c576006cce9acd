"""From a configuration to a ``FederatedRound``: the registered algorithm and its upload chain, the
registered wrappers, compressed uploads, and the cohort engine. Names no algorithm: it asks the
registry."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from fedjax_dp.algorithms import registry
from fedjax_dp.compression.config import with_compression
from fedjax_dp.core import hosts
from fedjax_dp.core.cohort import client_mesh
from fedjax_dp.core.loops import loops_left
from fedjax_dp.core.round import STEP_NOISE, FederatedRound, client_inputs
from fedjax_dp.core.strategy import MAX_UNROLLED_CONV_STEPS, StrategyChoice, choose_strategy
from fedjax_dp.core.uploads import Chain, DeclaredReleases, chain
from fedjax_dp.data.known_shapes import known_shapes
from fedjax_dp.data.packing import num_steps
from fedjax_dp.models import get_model
from fedjax_dp.privacy.sampling import build as client_sampler
from fedjax_dp.privacy.settings import PrivacySettings
from fedjax_dp.privacy.tracker import PrivacyTracker, tracker_for
from fedjax_dp.training.cohorts import expected_cohort, make_packer


def resolve_engine(
    cfg,
    has_conv: bool,
    cohort_size: int,
    loop_free_steps: int | None = None,
    per_example: bool = False,
) -> StrategyChoice:
    """``auto`` fields replaced by the measured choice (``core.strategy``); explicit values kept."""
    auto = choose_strategy(
        has_conv, cohort_size, loop_free_steps=loop_free_steps, per_example=per_example
    )
    # several hosts: one traced program over the global mesh
    if hosts.distributed() and auto.strategy == "loop":
        auto = dataclasses.replace(auto, strategy="sequential")
    e = cfg.engine
    # every process's devices (config_validation allows num_devices 0 or all of them)
    if hosts.distributed():
        return dataclasses.replace(_resolved(e, auto), devices=jax.device_count())
    return _resolved(e, auto)


def _resolved(e, auto: StrategyChoice) -> StrategyChoice:
    return StrategyChoice(
        strategy=auto.strategy if e.strategy == "auto" else e.strategy,
        chunk_size=(auto.chunk_size if e.strategy == "auto" else (e.chunk_size or None)),
        unroll=(
            auto.unroll if e.unroll == "auto" else (True if e.unroll == "full" else int(e.unroll))
        ),
        conv_impl=auto.conv_impl if e.conv_impl == "auto" else e.conv_impl,
        devices=e.num_devices or (auto.devices if e.strategy == "auto" else 1),
    )


def local_steps(cfg, requirements, train_sizes) -> int:
    """The local steps of a client's round: the algorithm's sampled steps, or epochs x batches of
    the largest client."""
    if requirements.sampled_steps:
        return int(requirements.sampled_steps)
    return num_steps(int(max(train_sizes)), cfg.client.batch_size, cfg.client.epochs)


def client_program_is_loop_free(cfg, dataset, model, runner: FederatedRound) -> bool:
    """Whether ``runner``'s client program runs no loop once its local steps are unrolled
    (``core.loops``; the local-training scan is the one the engine's ``unroll`` reaches, so it is
    traced with every step unrolled). Traced, not compiled, on one client of the data: what the
    algorithm does decides, not what it declares."""
    algorithm = runner.algorithm
    requirements = algorithm.requirements
    cohort = make_packer(cfg, dataset, requirements)([0], np.random.default_rng(0), None)
    client = jax.tree_util.tree_map(lambda x: x[0], client_inputs(cohort, jax.random.key(0)))
    if requirements.step_noise:  # the slot's DP-SGD noise multiplier, as the round passes it
        client[STEP_NOISE] = np.float32(1.0)
    params = jax.eval_shape(model.init, jax.random.key(0))
    shared = jax.eval_shape(lambda p: algorithm.broadcast(runner.init(p)), params)
    state = (
        jax.eval_shape(algorithm.client_state_init, params) if requirements.client_state else None
    )
    return not loops_left(
        jax.make_jaxpr(algorithm.client_update)(shared, client, state, client["key"])
    )


def build_model_and_round(cfg, dataset, server_set=None):
    """``(choice, model, round)`` for ``dataset``. On a CPU the engine's choice for a conv model
    depends on whether the client program is loop-free once unrolled
    (``client_program_is_loop_free``, traced) and takes per-example gradients (the algorithm's
    requirements): the round is built with the default choice, and again when these change the
    choice (building traces shapes only)."""
    # probed with the data's shape
    has_conv = get_model(cfg.model.name, dataset.example_shape, dataset.num_classes).has_conv
    cohort = int(expected_cohort(cfg, dataset.num_clients))

    def build(choice):
        model = get_model(
            cfg.model.name,
            dataset.example_shape,
            dataset.num_classes,
            conv_impl=choice.conv_impl,
            compute_dtype=cfg.model.compute_dtype or None,
        )
        return model, build_round(
            cfg, model, choice, dataset.num_clients, server_set, dataset.train_sizes(), dataset
        )

    first = resolve_engine(cfg, has_conv, cohort)
    model, runner = build(first)
    requirements = runner.algorithm.requirements
    # the local steps of a loop-free client program, the only case where ``auto`` unrolls them
    steps = None
    if has_conv and jax.default_backend() == "cpu" and not requirements.per_example_gradients:
        candidate = local_steps(cfg, requirements, dataset.train_sizes())
        if candidate <= MAX_UNROLLED_CONV_STEPS:
            unrolled_model, unrolled = build(dataclasses.replace(first, unroll=True))
            steps = (
                candidate
                if client_program_is_loop_free(cfg, dataset, unrolled_model, unrolled)
                else None
            )
    choice = resolve_engine(cfg, has_conv, cohort, steps, requirements.per_example_gradients)
    if choice != first:
        model, runner = build(choice)
    return choice, model, runner


def build_round(
    cfg,
    model,
    choice: StrategyChoice,
    num_clients: int,
    server_set=None,
    client_sizes=None,
    dataset=None,
) -> FederatedRound:
    """The configured algorithm, wrapped by each enabled wrapper, with its uploads
    (``client_sizes``: each client's training-set size, for mechanisms calibrated per client;
    ``dataset``: the loaded data, None for a stand-in round). A wrapper's own releases
    (``Wrapper.releases``) are declared at the chain's end (``DeclaredReleases``)."""
    params_template = jax.eval_shape(model.init, jax.random.key(0))
    sizes = None if client_sizes is None else tuple(int(n) for n in client_sizes)
    context = registry.BuildContext(
        cfg, model, num_clients, choice.unroll, params_template, sizes, dataset
    )
    algorithm, uploads = registry.get(cfg.algorithm).build(context)
    uploads = uploads if isinstance(uploads, Chain) else chain(*uploads)
    for wrapper in registry.wrappers():
        if wrapper.enabled(cfg):
            algorithm = wrapper.wrap(context, algorithm, server_set)
    if cfg.compression.enabled:
        uploads = with_compression(uploads, cfg.compression)
    declared = tuple(r for w in registry.wrappers() for r in w.own_releases(cfg))
    if declared:
        uploads = chain(*uploads, DeclaredReleases(declared))
    return FederatedRound(
        algorithm,
        uploads,
        choice.strategy,
        choice.chunk_size,
        stream_size=cfg.engine.stream_clients or None,
        max_replicated_bytes=int(cfg.engine.max_replicated_gb * 2**30),
        **spread(choice),
    )


def spread(choice: StrategyChoice) -> dict:
    """The engine's ``devices`` (``loop``: clients round-robin) or ``mesh`` (traced strategies:
    ``shard_map``) for ``choice.devices`` > 1; nothing for one device. Under several processes: a
    mesh over every process's devices."""
    if hosts.distributed():
        return {"mesh": client_mesh()}
    if choice.devices <= 1:
        return {}
    if choice.strategy != "loop":
        return {"mesh": client_mesh(choice.devices)}
    devices = jax.local_devices()
    if choice.devices > len(devices):
        raise ValueError(
            f"engine.num_devices={choice.devices} but {len(devices)} local devices exist"
        )
    return {"devices": tuple(devices[: choice.devices])}


def shares_server_set(cfg) -> bool:
    """The algorithm's data side mixes the server-held set into every client (a shared-data
    baseline)."""
    return registry.get(cfg.algorithm).shares_server_set


def needs_server_set(cfg) -> bool:
    return (
        shares_server_set(cfg)
        or registry.get(cfg.algorithm).server_validation
        or any(w.reads_server_set(cfg) for w in registry.wrappers())
    )


def validates_on_server_set(cfg) -> bool:
    """Each evaluation also scores the global model on the held-out server set
    (``validation_accuracy``)."""
    return registry.get(cfg.algorithm).server_validation


def privacy_tracker(cfg, runner: FederatedRound, dataset):
    """The run's privacy tracker (one kind for every algorithm): on the algorithm's own ledger where
    it declares one (example-level DP in its local steps), else on the ledger the releases of its
    upload chain and the sampler choose (``privacy.tracker.tracker_for``, which refuses an event
    that ledger cannot compose); None where nothing private is released."""
    settings = PrivacySettings.from_config(cfg)
    own = registry.get(cfg.algorithm).ledger
    if own is not None:
        return PrivacyTracker(own(cfg, dataset, runner.algorithm), settings)
    if runner.uploads.releases_anything:
        sampler = client_sampler(cfg.sampling, dataset.num_clients)
        return tracker_for(runner.uploads.releases(1), settings, sampler)
    return None


def check_releases_before_data(cfg) -> None:
    """The ledger's refusal of an event it cannot compose (``UnsupportedEventError``), before any
    data loads: the configured round is built on a stand-in model of the source's known input
    shape and classes, and its upload chain's releases are given to the ledger the run will use. A
    source whose shapes are known only from its data is checked when the run's tracker is built,
    after loading; so is a round that cannot be built without the data (a server-held set, the
    clients' sizes)."""
    planned_releases(cfg)


def planned_releases(cfg):
    """``(tracker, uploads)``: the tracker the run of ``cfg`` will account on, with no round
    recorded yet (a ledger that cannot compose the releases refuses here), and the upload chain
    whose ``releases(t)`` are round t's, both built before any data loads on the round of a stand-in
    model (``check_releases_before_data``); None where nothing private is released, or where that is
    known only from the data or the algorithm keeps its own ledger."""
    shape, classes = known_shapes(cfg.data.source)
    if shape is None or registry.get(cfg.algorithm).ledger is not None:
        return None
    try:
        model = get_model(cfg.model.name, shape, classes)
        cohort = int(expected_cohort(cfg, cfg.data.num_clients))
        runner = build_round(
            cfg, model, resolve_engine(cfg, model.has_conv, cohort), cfg.data.num_clients
        )
    except (TypeError, ValueError, AttributeError):  # needs the data: checked after loading
        return None
    if not runner.uploads.releases_anything:
        return None
    sampler = client_sampler(cfg.sampling, cfg.data.num_clients)
    tracker = tracker_for(runner.uploads.releases(1), PrivacySettings.from_config(cfg), sampler)
    return tracker, runner.uploads


def server_set_notes(cfg) -> list[str]:
    """What ``privacy.json`` says about a server-held set the run used."""
    notes = [
        w.privacy_note for w in registry.wrappers() if w.reads_server_set(cfg) and w.privacy_note
    ]
    if registry.get(cfg.algorithm).shares_server_set:
        notes.append(
            "the shared set is distributed to every client: those examples are public to all"
            " clients"
        )
    return notes


def server_set_breaches(cfg) -> list[str]:
    """Why a server-held set voids the client-level guarantee: it is drawn
    from the protected clients' own examples (IID, ``server_data.overlap`` < 0) or partly from their
    writers (overlap > 0), and is used without noise. Held-out writers only (overlap 0) keep the
    guarantee."""
    if not needs_server_set(cfg):
        return []
    overlap = cfg.server_data.overlap
    if overlap < 0:
        return [
            "the server-held set (D_meta / shared set) is drawn IID from the training clients' own"
            f" examples (server_data.overlap={overlap}) and used without noise: those clients' data"
            " is not protected; use server_data.overlap=0 (held-out writers, natural partitions)"
            " for a formal guarantee"
        ]
    if overlap > 0:
        return [
            f"the server-held set comes {overlap:.0%} from training clients' writers"
            f" (server_data.overlap={overlap}) and is used without noise: those clients' data is"
            " not protected"
        ]
    return []


def compression_rates(uploads: Chain) -> list[float] | None:
    """The layer rates a specialised chain's compressor uses (logged per round), or None without
    one."""
    compressors = [t for t in uploads if t.kind == "compress"]
    return compressors[0].layer_rates() if compressors else None
