"""Overrides of keys that are read only under another key's value. Such an override, where nothing
reads it, would be ignored without a word (``sampling.cohort_size=50`` under Poisson sampling ran q
K clients a round; ``dp.noise_multiplier=1.3`` beside ``privacy.target_epsilon=8`` ran the
calibrated z), so the configuration check refuses it, naming the key, its value and what would read
it.

Keys an algorithm never reads are declared where it is registered
(``registry.register(unread=...)``: ``client.epochs`` where local training runs sampled steps, the
server optimizer where the server step is the algorithm's own). Only overrides are checked
(``Experiment(config, overrides)``, ``--config.KEY=VALUE``): a shipped config may hold values for an
option it leaves off (``uga_fedmeta_*``: FedMeta's rates, for ``fedmeta.enabled=True``). Sections
the chosen algorithm does not read at all are the registry's to refuse
(``algorithms.registry.validate``); an on/off section (``compression``, the wrappers such as
``fedmeta``) is read only with ``enabled=True``.
"""

from __future__ import annotations

from fedjax_dp.algorithms import registry
from fedjax_dp.core import config_sections
from fedjax_dp.data import sources

READ_ONLY_WHEN = (
    # (key, the key that decides, the values under which the first key is read)
    ("data.alpha", "data.partition", ("dirichlet",)),
    ("data.shards_per_client", "data.partition", ("shards",)),
    ("data.classes_per_client", "data.partition", ("acid", "alid")),
    ("data.max_train_per_client", "data.partition", ("acid", "alid")),
    ("data.max_test_per_client", "data.partition", ("acid", "alid")),
    ("data.invert", "data.source", ("femnist",)),
    ("data.sequence_length", "data.source", ("shakespeare",)),
    ("client.momentum", "client.optimizer", ("sgd",)),
    ("server.momentum", "server.optimizer", ("sgd",)),
    ("engine.chunk_size", "engine.strategy", ("chunked",)),
)
"""The generic sections' conditional keys (checked against the source: each is read nowhere else);
the algorithm sections register theirs with the section
(``registry.register_section(read_when=...)``)."""


PARTITION_KEYS = (
    "data.partition",
    "data.shards_per_client",
    "data.alpha",
    "data.classes_per_client",
    "data.max_train_per_client",
    "data.max_test_per_client",
    "data.min_train_per_client",
)
"""What deals a pool of examples out to clients: unread where the source gives its own clients
(``data.sources``, kind ``clients``)."""


def _value(cfg, dotted: str):
    section, key = dotted.split(".")
    return cfg[section][key]


def _expand(cfg, overridden) -> list[str]:
    """Dotted leaf keys of ``overridden`` (a whole section stands for each of its keys)."""
    keys = []
    for key in overridden:
        node = cfg.get(key) if "." not in key else None
        keys += [f"{key}.{leaf}" for leaf in node.keys()] if hasattr(node, "keys") else [key]
    return keys


def check_unread_keys(cfg, overridden, need) -> None:
    """``need(False, message)`` for each overridden key that ``cfg`` does not read: one of
    ``READ_ONLY_WHEN`` while its deciding key holds a value that does not read it, or a key of an
    on/off section that is off."""
    entry = registry.get(cfg.algorithm) if cfg.algorithm in registry.names() else None
    owned = set(registry.sections())
    # on/off sections: the owned ones with a switch key, and the wrappers
    switched = {n for n, s in config_sections.sections().items() if s.switch}
    switched.update(w.name for w in registry.wrappers())
    wrappers = {w.name: w for w in registry.wrappers()}
    conditions = {}
    for key, decider, reading in READ_ONLY_WHEN + config_sections.read_when():
        conditions.setdefault(key, []).append((decider, reading))
    own_clients = sources.kind(cfg.data.source) == "clients"
    for key in _expand(cfg, overridden):
        section, _, leaf = key.partition(".")
        if own_clients and key in PARTITION_KEYS:
            need(
                False,
                f"{key}={_value(cfg, key)!r} is not read: data.source={cfg.data.source!r} gives its"
                " own clients (no partition); drop it",
            )
            continue
        if (
            section in owned
            and section not in switched
            and (entry is None or section not in entry.sections)
        ):
            continue
        if entry is not None and key in entry.unread:
            why = (
                "its clients run a fixed number of sampled steps, `local_steps`"
                if key in registry.SAMPLED_STEPS
                else "its server step is its own"
            )
            need(
                False,
                f"{key}={_value(cfg, key)!r} is not read by algorithm {entry.name!r}: {why}"
                f" (section {' / '.join(entry.sections)}); drop it",
            )
        for decider, reading in conditions.get(key, ()):
            decided = _value(cfg, decider)
            need(
                decided in reading,
                f"{key}={_value(cfg, key)!r} is not read while {decider}={decided!r} (only with "
                f"{decider} {' or '.join(map(repr, reading))}): change {decider} or drop {key}",
            )
        if section not in switched:
            continue
        wrapper = wrappers.get(section)
        switch_key = wrapper.switch_key if wrapper is not None else "enabled"
        on = wrapper.enabled(cfg) if wrapper is not None else cfg[section].enabled
        if leaf != switch_key and not on:
            turn_on = "=True" if switch_key == "enabled" else " to a value that turns it on"
            need(
                False,
                f"{key}={_value(cfg, key)!r} is not read while"
                f" {section}.{switch_key}={cfg[section][switch_key]!r}: set"
                f" {section}.{switch_key}{turn_on} to use it, or drop {key}",
            )
