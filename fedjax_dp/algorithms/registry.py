"""The algorithm registry: name -> (the config sections it reads, its validation, its builder).

An algorithm module registers itself::

    registry.register("fedprox", build=build_fedprox, sections=("fedprox",), validate=check_fedprox)
    registry.register_section("fedprox", {"mu": 2e-4})

and the training layer asks the registry, never an algorithm's name. A builder takes a
``BuildContext`` (config, model, engine choices, population, server-held set) and returns
``(algorithm, upload transforms)``. Adding an algorithm = its module (imported by
``fedjax_dp.algorithms``) + its tests; a test file may register a toy algorithm too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import ml_collections

from fedjax_dp.core import config_sections, deferred_dense
from fedjax_dp.core.optimizers import build_optimizer
from fedjax_dp.privacy import sampling
from fedjax_dp.privacy import settings as privacy_settings

DEFAULT_PRIVACY_KEYS = privacy_settings.ACCOUNTING + privacy_settings.BUDGETS
"""What an algorithm reads of the ``privacy`` section unless it says otherwise: what the generic
tracker uses (a toy DP algorithm registered from a test takes ``privacy.delta``); non-private
algorithms register ``()``."""


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """What a builder may use. ``unroll``: local training's scan unroll (engine choice)."""

    cfg: Any
    model: Any
    num_clients: int
    unroll: int | bool = 1
    params_template: Any = None  # the model's parameters (shapes), e.g. for per-layer clip norms
    # each client's training-set size |D_n| (per-client calibration)
    client_sizes: tuple | None = None
    # the loaded data (``FederatedDataset``), where the round is built for a run; None for a
    # stand-in round built before the data loads (``training.build.planned_releases``)
    dataset: Any = None

    def client_optimizer(self):
        c = self.cfg.client
        return build_optimizer(
            c.optimizer,
            c.learning_rate,
            c.momentum,
            weight_decay=c.weight_decay,
            grad_clip_norm=c.grad_clip_norm,
        )

    def deferred_dense_rate(self) -> float | None:
        """The client's SGD rate where local training may defer large dense kernels
        (``engine.deferred_dense``, ``core.deferred_dense``): plain SGD only (momentum, weight decay
        and gradient clipping make a step's change full-rank); None otherwise."""
        c, mode = self.cfg.client, self.cfg.engine.deferred_dense
        plain = c.optimizer == "sgd" and not (c.momentum or c.weight_decay or c.grad_clip_norm)
        wanted = mode == "on" or (mode == "auto" and deferred_dense.on_by_default())
        return float(c.learning_rate) if plain and wanted else None

    def server_optimizer(self):
        s = self.cfg.server
        return build_optimizer(s.optimizer, s.learning_rate, s.momentum, s.lr_decay)

    def client_fields(self) -> dict:
        """The keyword fields FedAvg and SCAFFOLD (and their subclasses) take from the config: the
        server optimizer, the client's learning-rate decay and local training's scan unroll."""
        return dict(
            server_optimizer=self.server_optimizer(),
            client_lr_decay=self.cfg.client.lr_decay,
            unroll=self.unroll,
        )

    def sampler(self):
        """The sampler that draws the run's cohorts (``privacy.sampling``)."""
        return sampling.build(self.cfg.sampling, self.num_clients)

    def expected_cohort(self) -> float:
        """The fixed denominator of a round: the sampler's (m, q K, a participation scheme's)."""
        return self.sampler().expected_cohort()

    def denominators(self) -> tuple:
        """((first round, D_t), ...) where the fixed denominator follows a sampling-rate schedule,
        else ()."""
        return self.sampler().denominators()

    def sampling_rate(self) -> float:
        """lambda: the chance that a given client is in a round's cohort."""
        return self.expected_cohort() / self.num_clients


Validate = Callable[[Any, Callable[[bool, str], None]], None]


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    build: Callable[[BuildContext], tuple]
    sections: tuple[str, ...] = ()
    validate: Validate | None = None
    # data side: the server-held set is mixed into every client (FedShare)
    shares_server_set: bool = False
    summary: str = ""
    # the server validates each evaluated model on a held-out server set
    server_validation: bool = False
    # ``ledger(cfg, dataset, algorithm)``: the algorithm's own ledger of the privacy
    ledger: Callable | None = None
    # tracker (``privacy.ledgers.client_level.Ledger``: example-level DP in local steps), built from
    # the algorithm that runs;
    # None: the tracker's central or local ledger over the upload chain's releases
    # generic keys it never reads (``SAMPLED_STEPS``, ``OWN_SERVER_STEP``): an
    unread: tuple[str, ...] = ()
    # override of one is refused (``training.unread_keys``)
    # the ``privacy`` section keys it reads (secure_rng: all)
    privacy_keys: tuple[str, ...] = DEFAULT_PRIVACY_KEYS
    # runs correlated noise under a participation scheme (``sampling.method`` such as
    participation: bool = False
    # min_separation: ``privacy.correlated``)
    # its client and server learning rates act only through its optimizers' steps (FedAvg with
    # another local objective or chain), so a factor on each step's update is a factor on the rate:
    # ``hypergrad.Hypertuned`` scales them (hyper-gradients of the rates, runs batched with traced
    # rates in ``training.run_batch``)
    scaled_rates: bool = False


@dataclasses.dataclass(frozen=True)
class Wrapper:
    """An option that wraps any registered algorithm (FedMeta's server meta step): ``wrap(ctx,
    algorithm, server_set)`` when its section has ``enabled`` set, or where its ``switch(cfg)``
    says so (a section turned on by another key: ``hypergrad.hyper_lr`` > 0)."""

    name: str
    wrap: Callable[[BuildContext, Any, Any], Any]
    validate: Validate | None = None
    needs_server_set: bool | Callable[[Any], bool] = False  # or a function of the config
    privacy_note: str = ""
    switch: Callable[[Any], bool] | None = None
    switch_key: str = "enabled"  # the key that turns the wrapper on (the one ``switch`` reads)
    # ``privacy_label(cfg) -> dict``: what privacy.json records under the wrapper's name
    privacy_label: Callable[[Any], dict] | None = None
    # ``releases(cfg) -> list[Release]``: what the wrapper itself releases each round on the round's
    # cohort (declared in the upload chain and in calibration beside the chain's own)
    releases: Callable[[Any], list] | None = None

    def enabled(self, cfg) -> bool:
        if self.switch is not None:
            return bool(self.switch(cfg))
        return bool(cfg[self.name].enabled)

    def reads_server_set(self, cfg) -> bool:
        """Whether the wrapper, as configured, needs the server-held set."""
        needs = self.needs_server_set
        return bool(needs(cfg) if callable(needs) else needs) and self.enabled(cfg)

    def own_releases(self, cfg) -> list:
        """The wrapper's own releases under ``cfg`` (none when it is off)."""
        return list(self.releases(cfg)) if self.releases and self.enabled(cfg) else []


_ENTRIES: dict[str, Entry] = {}
_SECTIONS: set[str] = set()  # the algorithm- and wrapper-owned sections (``core.config_sections``)
_WRAPPERS: dict[str, Wrapper] = {}


SAMPLED_STEPS = ("client.epochs",)
"""Unread where local training runs a fixed number of sampled steps (its section's ``local_steps``),
not epochs."""
OWN_SERVER_STEP = ("server.optimizer", "server.learning_rate", "server.momentum", "server.lr_decay")
"""Unread where the server update is the algorithm's own (PFLDyn's w + Delta - g / alpha; the
patent's alpha step)."""


def register(
    name: str,
    *,
    build,
    sections=(),
    validate=None,
    shares_server_set=False,
    summary="",
    server_validation=False,
    ledger=None,
    unread=(),
    privacy_keys=DEFAULT_PRIVACY_KEYS,
    participation=False,
    scaled_rates=False,
) -> Entry:
    if name in _ENTRIES:
        raise ValueError(f"algorithm {name!r} is already registered")
    for section in sections:
        if section not in _SECTIONS:
            raise ValueError(
                f"algorithm {name!r} reads config section {section!r}, which is not registered "
                "(register_section first)"
            )
    unknown = [k for k in privacy_keys if k not in privacy_settings.SECTION]
    if unknown:
        raise ValueError(
            f"algorithm {name!r} reads privacy keys {unknown} the privacy section does not have"
        )
    _ENTRIES[name] = Entry(
        name,
        build,
        tuple(sections),
        validate,
        shares_server_set,
        summary,
        server_validation,
        ledger,
        tuple(unread),
        tuple(privacy_keys),
        participation,
        scaled_rates,
    )
    return _ENTRIES[name]


def register_wrapper(
    name: str,
    defaults: dict,
    *,
    wrap,
    validate=None,
    needs_server_set=False,
    privacy_note="",
    docs=None,
    read_when=(),
    switch=None,
    switch_key="enabled",
    privacy_label=None,
    releases=None,
) -> Wrapper:
    """A wrapper with its config section ``name``, which must hold ``enabled`` unless
    ``switch(cfg)`` says when the wrapper is on (reading ``switch_key``)."""
    if switch is None and "enabled" not in defaults:
        raise ValueError(f"wrapper section {name!r} needs an 'enabled' key (or a switch)")
    register_section(name, defaults, docs=docs, read_when=read_when)
    _WRAPPERS[name] = Wrapper(
        name,
        wrap,
        validate,
        needs_server_set,
        privacy_note,
        switch,
        switch_key,
        privacy_label,
        releases,
    )
    return _WRAPPERS[name]


def unwrap(algorithm, cls):
    """The ``cls`` instance inside ``algorithm`` (itself, or the ``base`` a wrapper such as FedMeta
    holds)."""
    while not isinstance(algorithm, cls):
        if not hasattr(algorithm, "base"):
            raise TypeError(
                f"expected a {cls.__name__} (or a wrapper of one), got {type(algorithm).__name__}"
            )
        algorithm = algorithm.base
    return algorithm


def wrappers() -> tuple[Wrapper, ...]:
    return tuple(_WRAPPERS.values())


def unregister(name: str) -> None:
    """Removes an entry (tests that register a toy algorithm clean up with this)."""
    _ENTRIES.pop(name, None)


def register_section(
    name: str, defaults: dict, docs: dict | None = None, read_when: tuple = ()
) -> None:
    """An algorithm-owned config section and its defaults (added to every default config), what each
    key means (``docs``: key -> meaning, for ``fedjax-dp --help``) and the keys read only under
    another key's value (``read_when``: (key, deciding key, the values that read it), dotted keys:
    ``training.unread_keys``); kept with every owned section in ``core.config_sections``."""
    config_sections.register_section(name, defaults, docs=docs, read_when=read_when)
    _SECTIONS.add(name)


def names() -> tuple[str, ...]:
    return tuple(sorted(_ENTRIES))


def with_scaled_rates() -> tuple[str, ...]:
    """The algorithms whose learning rates ``hypergrad.Hypertuned`` can scale (``Entry``)."""
    return tuple(n for n in names() if _ENTRIES[n].scaled_rates)


def get(name: str) -> Entry:
    if name not in _ENTRIES:
        raise ValueError(f"algorithm {name!r} unknown; available: {names()}")
    return _ENTRIES[name]


def sections() -> dict[str, ml_collections.ConfigDict]:
    """Every registered algorithm (and wrapper) section, with its defaults."""
    owned = config_sections.sections()
    return {name: ml_collections.ConfigDict(dict(owned[name].defaults)) for name in _SECTIONS}


def unread_section(cfg) -> Callable[[str], bool]:
    """Whether a section is one the configured algorithm does not read (another algorithm's, or a
    wrapper's that is off)."""
    entry = _ENTRIES.get(cfg.algorithm)

    def unread(name: str) -> bool:
        if name in _WRAPPERS:
            return not _WRAPPERS[name].enabled(cfg)
        return name in _SECTIONS and (entry is None or name not in entry.sections)

    return unread


def validate(cfg, need) -> None:
    """The chosen algorithm's own checks, and refusal of values set in sections it does not read."""
    entry = _ENTRIES.get(cfg.algorithm)
    if entry is None:
        need(False, f"algorithm {cfg.algorithm!r} unknown; available: {names()}")
        return
    for wrapper in _WRAPPERS.values():
        if wrapper.enabled(cfg) and wrapper.validate is not None:
            wrapper.validate(cfg, need)
    for section, defaults in sections().items():
        if section in entry.sections or section in _WRAPPERS or section not in cfg:
            continue
        for key, default in defaults.items():
            value = cfg[section].get(key, default)
            need(
                value == default,
                f"{section}.{key}={value!r} is set, but algorithm {entry.name!r} does not read "
                f"section {section!r} (it reads: {', '.join(entry.sections) or 'none'})",
            )
    defaults = privacy_settings.SECTION
    for key, default in defaults.items():
        value = cfg.privacy.get(key, default)
        need(
            key == "secure_rng" or key in entry.privacy_keys or value == default,
            f"privacy.{key}={value!r} is set, but algorithm {entry.name!r} does not read it (it"
            f" reads privacy: {', '.join(entry.privacy_keys) or 'nothing but secure_rng'})",
        )
    method = cfg.sampling.method
    need(
        entry.participation or method not in sampling.participation_schemes(),
        f"sampling.method={method!r} is a participation scheme for correlated noise (dp.noise),"
        f" which algorithm={cfg.algorithm!r} does not run; algorithms that do:"
        f" {[n for n in names() if _ENTRIES[n].participation]}",
    )
    if entry.validate is not None:
        entry.validate(cfg, need)
