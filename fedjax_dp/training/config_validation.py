"""Checks an experiment configuration before any work and reports every problem at once: the generic
sections here, each algorithm's own section through the registry."""

from __future__ import annotations

import importlib.util
import math

import jax

import fedjax_dp.algorithms  # noqa: F401  (registers every algorithm)
from fedjax_dp.algorithms import registry
from fedjax_dp.core import config_sections
from fedjax_dp.core import hosts
from fedjax_dp.core.cohort import STRATEGIES
from fedjax_dp.core.deferred_dense import DEFERRED_DENSE_MODES as DEFERRED_DENSE
from fedjax_dp.data import sources
from fedjax_dp.data.builders import PARTITIONS
from fedjax_dp.data.augmentation import AUGMENTATIONS, FLIPPABLE_SOURCES
from fedjax_dp.data.normalization import CHANNEL_STATS, NORMALIZATIONS
from fedjax_dp.core.optimizers import OPTIMIZERS
from fedjax_dp.models import COMPUTE_DTYPES
from fedjax_dp.models import registry as models
from fedjax_dp.models.conv import CONV_IMPLS
from fedjax_dp.data.known_shapes import KNOWN_INPUT_SHAPES
from fedjax_dp.privacy.settings import check_privacy
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.unread_keys import check_unread_keys


def validate_config(cfg, overridden=()) -> None:
    """Raises ``ValueError`` listing each invalid value of ``cfg`` (not only the first);
    ``overridden``: the dotted keys a user set over the config (refused where ``cfg`` does not read
    them)."""
    errors = []

    def need(ok: bool, message: str):
        if not ok:
            errors.append(message)

    for key, value in _numbers(cfg):  # first, alone: every check below assumes finite numbers
        need(
            math.isfinite(value),
            f"{key}={value!r}: must be a finite number (no key takes inf or nan)",
        )
    if errors:
        raise ValueError("invalid configuration:\n  - " + "\n  - ".join(errors))
    need(cfg.rounds >= 1, f"rounds must be >= 1, got {cfg.rounds}")
    need(cfg.seed >= 0, f"seed must be >= 0 (numpy and JAX seed from it), got {cfg.seed}")
    need(cfg.eval_every >= 1, f"eval_every must be >= 1, got {cfg.eval_every}")
    need(
        cfg.divergence_rounds >= 0,
        f"divergence_rounds must be >= 0 (0: off), got {cfg.divergence_rounds}",
    )
    need(
        cfg.eval_client_data or not cfg.eval_prototypes,
        "eval_prototypes=True scores prototype classifiers on the clients' own data;"
        " eval_client_data=False forbids it",
    )
    need(
        not cfg.eval_prototypes or models.has_penultimate(cfg.model.name),
        "eval_prototypes needs a model with a hidden layer whose penultimate features it scores"
        f" ({[n for n in models.names() if models.has_penultimate(n)]}), got"
        f" model.name={cfg.model.name!r}",
    )
    need(
        cfg.checkpoint_every >= 0,
        f"checkpoint_every must be >= 0 (0 = only at exit), got {cfg.checkpoint_every}",
    )
    need(
        cfg.checkpoint_keep >= 0,
        f"checkpoint_keep must be >= 0 (0 = keep every checkpoint), got {cfg.checkpoint_keep}",
    )
    need(cfg.data.num_clients >= 1, f"data.num_clients must be >= 1, got {cfg.data.num_clients}")
    need(
        0 <= cfg.data.test_fraction < 1,
        f"data.test_fraction must lie in [0, 1), got {cfg.data.test_fraction}",
    )
    need(
        cfg.data.normalize in NORMALIZATIONS,
        f"data.normalize {cfg.data.normalize!r} unknown; available: {NORMALIZATIONS}",
    )
    need(
        cfg.data.normalize != "channel" or cfg.data.source in CHANNEL_STATS,
        f"data.normalize='channel' has published constants for {sorted(CHANNEL_STATS)}, not for "
        f"data.source={cfg.data.source!r}: use data.normalize='none'",
    )
    need(
        cfg.data.augment in AUGMENTATIONS,
        f"data.augment {cfg.data.augment!r} unknown; available: {AUGMENTATIONS}",
    )
    need(
        cfg.data.augment == "none" or cfg.data.source in FLIPPABLE_SOURCES,
        f"data.augment={cfg.data.augment!r} crops and mirrors natural images: for"
        f" {FLIPPABLE_SOURCES}, not data.source={cfg.data.source!r} (a mirrored digit or character"
        " is another symbol)",
    )
    need(
        cfg.data.partition in PARTITIONS,
        f"data.partition {cfg.data.partition!r} unknown; available: {PARTITIONS}",
    )
    need(
        sources.find(cfg.data.source) is not None,
        f"data.source {cfg.data.source!r} unknown; available: {sources.names()}",
    )
    need(
        sources.kind(cfg.data.source) != "natural" or cfg.data.partition == "natural",
        f"data.source {cfg.data.source!r} is partitioned by its natural clients: set"
        f" data.partition='natural', got {cfg.data.partition!r}",
    )
    need(
        cfg.data.source != "shakespeare" or importlib.util.find_spec("h5py") is not None,
        'data.source=shakespeare needs h5py: pip install "fedjax_dp[shakespeare]"',
    )
    need(
        cfg.data.partition != "dirichlet" or cfg.data.alpha > 0,
        f"data.alpha must be > 0, got {cfg.data.alpha}",
    )
    need(
        cfg.data.partition not in ("acid", "alid") or cfg.data.classes_per_client >= 1,
        f"data.classes_per_client must be >= 1 for partition {cfg.data.partition!r}, got"
        f" {cfg.data.classes_per_client}",
    )
    for key in ("max_train_per_client", "max_test_per_client"):
        need(
            cfg.data[key] >= 0,
            f"data.{key} must be >= 0 (0 = all of a client's examples), got {cfg.data[key]}",
        )
    need(
        cfg.data.min_train_per_client >= 0,
        "data.min_train_per_client must be >= 0 (0 = every client), got"
        f" {cfg.data.min_train_per_client}",
    )
    need(
        cfg.data.min_train_per_client == 0 or cfg.data.partition == "natural",
        f"data.min_train_per_client={cfg.data.min_train_per_client} selects natural clients"
        f" (writers, roles); data.partition={cfg.data.partition!r} makes its own clients",
    )
    need(
        models.is_registered(cfg.model.name),
        f"model.name {cfg.model.name!r} unknown; available: {models.names()}",
    )
    shape = KNOWN_INPUT_SHAPES.get(cfg.data.source.removeprefix("tfds:"))
    check_shape = (
        models.is_registered(cfg.model.name) and models.get(cfg.model.name).check_input_shape
    )
    if shape is not None and check_shape:
        try:
            check_shape(shape)
        except ValueError as error:
            need(False, f"{error} (data.source={cfg.data.source!r})")
    need(
        (cfg.model.compute_dtype or None) in COMPUTE_DTYPES,
        f"model.compute_dtype {cfg.model.compute_dtype!r} unknown; use '' (float32) or 'bfloat16'",
    )
    for side in ("client", "server"):
        opt = cfg[side]
        need(
            opt.optimizer in OPTIMIZERS,
            f"{side}.optimizer {opt.optimizer!r} unknown; available: {OPTIMIZERS}",
        )
        need(opt.learning_rate > 0, f"{side}.learning_rate must be > 0, got {opt.learning_rate}")
        need(opt.momentum >= 0, f"{side}.momentum must be >= 0, got {opt.momentum}")
    need(cfg.client.batch_size >= 1, f"client.batch_size must be >= 1, got {cfg.client.batch_size}")
    need(cfg.client.epochs >= 1, f"client.epochs E must be >= 1, got {cfg.client.epochs}")
    for key in ("weight_decay", "grad_clip_norm"):
        need(cfg.client[key] >= 0, f"client.{key} must be >= 0, got {cfg.client[key]}")
    for side in ("client", "server"):
        need(
            0 < cfg[side].lr_decay <= 1,
            f"{side}.lr_decay must lie in (0, 1], got {cfg[side].lr_decay}",
        )
    sd = cfg.server_data
    need(0 < sd.fraction <= 1, f"server_data.fraction must lie in (0, 1], got {sd.fraction}")
    need(
        sd.overlap < 0 or sd.overlap <= 1,
        f"server_data.overlap must be < 0 (IID) or in [0, 1], got {sd.overlap}",
    )
    e = cfg.engine
    need(
        e.strategy in STRATEGIES + ("auto",),
        f"engine.strategy {e.strategy!r} unknown; available: {STRATEGIES + ('auto',)}",
    )
    need(
        e.strategy != "chunked" or e.chunk_size >= 1,
        f"engine.chunk_size must be >= 1 for 'chunked', got {e.chunk_size}",
    )
    need(
        e.unroll in ("auto", "full") or (str(e.unroll).isdigit() and int(e.unroll) >= 1),
        f"engine.unroll must be 'auto', 'full' or a positive integer, got {e.unroll!r}",
    )
    need(
        e.conv_impl in CONV_IMPLS + ("auto",),
        f"engine.conv_impl {e.conv_impl!r} unknown; available: {CONV_IMPLS + ('auto',)}",
    )
    need(e.num_devices >= 0, f"engine.num_devices must be >= 0 (0 = auto), got {e.num_devices}")
    # several processes (``core.hosts``): one traced program over every host's devices
    if hosts.distributed():
        need(
            e.strategy != "loop",
            "engine.strategy='loop' runs clients from Python on one host; under "
            f"{jax.process_count()} processes choose vmap, chunked, sequential or auto",
        )
        need(
            e.num_devices in (0, jax.device_count()),
            f"engine.num_devices={e.num_devices}: under {jax.process_count()} processes the cohort"
            f" spreads over all {jax.device_count()} devices (set 0)",
        )
    need(
        isinstance(e.stream_clients, int) and e.stream_clients >= 0,
        "engine.stream_clients must be an integer >= 0 (0 = the whole cohort at once), got"
        f" {e.stream_clients!r}",
    )
    need(
        isinstance(e.max_replicated_gb, (int, float)) and e.max_replicated_gb >= 0,
        "engine.max_replicated_gb must be a number >= 0 (0 = never copy: one device), got"
        f" {e.max_replicated_gb!r}",
    )
    need(
        e.deferred_dense in DEFERRED_DENSE,
        f"engine.deferred_dense {e.deferred_dense!r} unknown; available: {DEFERRED_DENSE}",
    )
    _refuse_unknown_keys(cfg, default_config(), "", need)
    # the privacy section itself; which of its keys the algorithm reads: the registry
    check_privacy(cfg, need)
    # an override where the chosen value of another key does not read it
    check_unread_keys(cfg, overridden, need)
    # the owned sections' own checks (sampling, compression, ...)
    config_sections.validate(cfg, need, unread=registry.unread_section(cfg))
    # the algorithm's own section, and sections it does not read left alone
    registry.validate(cfg, need)
    if errors:
        raise ValueError("invalid configuration:\n  - " + "\n  - ".join(errors))


def _numbers(cfg, prefix: str = ""):
    """``(dotted key, value)`` of every float in ``cfg`` (``dp.clip_norm=inf``
    passed the ``> 0`` check, wrote the non-standard ``Infinity`` to config.json and failed in round
    1)."""
    for key, value in cfg.items():
        if hasattr(value, "items"):
            yield from _numbers(value, f"{prefix}{key}.")
        elif isinstance(value, float):
            yield f"{prefix}{key}", value


def _refuse_unknown_keys(cfg, defaults, prefix: str, need, root=None) -> None:
    """Every key must be one the defaults define (a misspelt key would otherwise be silently
    ignored); each unknown key is named with the closest known one."""
    from fedjax_dp.configs import unknown_key_message

    root = defaults if root is None else root
    for key in cfg.keys():
        path = f"{prefix}{key}"
        if key not in defaults:
            message = unknown_key_message(path, root)
            need(False, message.replace(f"{path!r}", f"{path!r} (= {cfg[key]!r})", 1))
        elif hasattr(cfg[key], "keys") and hasattr(defaults[key], "keys"):
            _refuse_unknown_keys(cfg[key], defaults[key], path + ".", need, root)
