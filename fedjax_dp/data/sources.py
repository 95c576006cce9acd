"""The data-source registry: ``data.source`` names an entry, and the entry says how its examples
become clients.

Three kinds: ``pooled`` sources give arrays that ``data.partition`` deals out to clients (MNIST,
CIFAR, ``tfds:<name>``); ``natural`` sources come with one client per writer or speaking role
(``data.partition='natural'``: FEMNIST, Shakespeare); ``clients`` sources give their own clients
(yours: ``register_data``, ``data/client_data.py``), and no partition is read. The shipped sources
(``data/builders.py``) and yours are entries of this one registry, so the configuration check, the
command line (``--config.data.source``) and ``build_dataset`` ask it, never a fixed list.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Callable

NAME = re.compile(r"[A-Za-z0-9_][\w.-]*")
"""A source's name: one token the command line can carry (``--config.data.source=NAME``)."""
KINDS = ("pooled", "natural", "clients")


@dataclasses.dataclass(frozen=True)
class Source:
    """A registered data source.

    Attributes:
      name: what ``data.source`` says (a ``prefix`` entry: its start, ``tfds:``).
      kind: one of ``KINDS``.
      load: pooled: ``(data config) -> (x, y, x_test, y_test, num_classes)`` (the test arrays None
        where the source has no test split); natural: ``(data config, rng) -> FederatedDataset``;
        clients: ``(data config, seed) -> FederatedDataset``.
      prefix: the entry serves every name that starts with ``name``.
      num_clients: a clients source's number of clients where it is known before loading (data
        held in memory); None otherwise.
      summary: one line for listings.
    """

    name: str
    kind: str
    load: Callable
    prefix: bool = False
    num_clients: int | None = None
    summary: str = ""


_ENTRIES: dict[str, Source] = {}
_SHIPPED: set[str] = set()


def register(
    name: str,
    kind: str,
    load: Callable,
    *,
    prefix: bool = False,
    num_clients: int | None = None,
    summary: str = "",
    replace: bool = False,
    shipped: bool = False,
) -> Source:
    """Adds a source; a name already taken is refused unless ``replace`` (a notebook cell run
    again), and a shipped source is never replaced."""
    if kind not in KINDS:
        raise ValueError(f"data source kind {kind!r} unknown; use one of {KINDS}")
    if not isinstance(name, str) or not (NAME.fullmatch(name) or (prefix and name.endswith(":"))):
        raise ValueError(
            f"data source name {name!r} must be one word of letters, digits, '_', '.' or '-' (it"
            " is written as --config.data.source=NAME)"
        )
    if name in _ENTRIES and (not replace or name in _SHIPPED):
        raise ValueError(
            f"data source {name!r} is already registered"
            + (" (a shipped source)" if name in _SHIPPED else "; pass replace=True to replace it")
        )
    _ENTRIES[name] = Source(name, kind, load, prefix, num_clients, summary)
    if shipped:
        _SHIPPED.add(name)
    return _ENTRIES[name]


def unregister(name: str) -> None:
    """Removes a source registered from outside the package (tests clean up with this)."""
    if name not in _SHIPPED:
        _ENTRIES.pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered source (a prefix entry as ``tfds:<name>``), the shipped ones first."""
    return tuple(f"{n}<name>" if e.prefix else n for n, e in _ENTRIES.items())


def find(name) -> Source | None:
    """The entry serving ``name``, or None."""
    if not isinstance(name, str):
        return None
    if name in _ENTRIES and not _ENTRIES[name].prefix:
        return _ENTRIES[name]
    return next((e for n, e in _ENTRIES.items() if e.prefix and name.startswith(n)), None)


def get(name: str) -> Source:
    entry = find(name)
    if entry is None:
        raise ValueError(f"unknown data source {name!r}; available: {names()}")
    return entry


def kind(name: str) -> str | None:
    """The kind of source ``name`` is, None for an unknown name (the configuration check names that
    separately)."""
    entry = find(name)
    return entry.kind if entry is not None else None


def is_shipped(name: str) -> bool:
    entry = find(name)
    return entry is not None and entry.name in _SHIPPED


_OBJECTS: dict[str, object] = {}  # name -> the data registered under it (to reuse the name)


def register_data(
    name: str | None,
    data,
    *,
    num_classes: int | None = None,
    client_feature: str | None = None,
    x_feature: str = "image",
    y_feature: str = "label",
    replace: bool = False,
) -> str:
    """Registers your federated data as a ``clients`` source under ``name`` (None: the name it
    already has, else ``clients``, ``clients_2``, ...) and returns the name, for ``data.source`` in
    a config or ``--config.data.source``.

    Args:
      data: a mapping from client id to arrays (``client_data``: checked here, at once), a
        ``FederatedDataset``, a prepared TFDS builder with ``client_feature`` naming each example's
        client (``tfds_clients``: read when a run loads it), or a function of no arguments returning
        one of these (called when a run loads it).
      num_classes: the class count; None: the largest label + 1 (or the TFDS label feature's).
      client_feature, x_feature, y_feature: a TFDS builder's features.
      replace: replace a source of yours registered under ``name`` (a notebook cell run again).
    """
    from fedjax_dp.data import client_data
    from fedjax_dp.data.federated_dataset import FederatedDataset

    if name is None:
        name = next((n for n, obj in _OBJECTS.items() if obj is data), None)
        if name is not None:
            return name
        name, k = "clients", 1
        while find(name) is not None:
            k += 1
            name = f"clients_{k}"
    count = None
    if isinstance(data, FederatedDataset):
        count = data.num_clients
    elif hasattr(data, "as_data_source") and hasattr(data, "info"):
        if not client_feature:
            raise ValueError(
                f"register_data({name!r}, <TFDS builder {data.name!r}>): name the feature that"
                " holds each example's client: client_feature=..."
            )
    elif isinstance(data, Mapping):
        count = len(client_data.check_clients(data, num_classes))
    elif not callable(data):
        raise ValueError(
            f"register_data({name!r}, ...): {type(data).__name__} is not federated data; give a"
            " mapping from client id to (x, y) arrays, a FederatedDataset, a TFDS builder with"
            " client_feature=..., or a function returning one of them"
        )

    def load(cfg, seed):
        given = data() if callable(data) and not isinstance(data, Mapping) else data
        return _as_dataset(
            given,
            name,
            cfg,
            seed,
            num_classes=num_classes,
            client_feature=client_feature,
            x_feature=x_feature,
            y_feature=y_feature,
        )

    register(
        name,
        "clients",
        load,
        num_clients=count,
        summary=f"yours: {type(data).__name__}",
        replace=replace,
    )
    _OBJECTS[name] = data
    return name


def _as_dataset(data, name, cfg, seed, *, num_classes, client_feature, x_feature, y_feature):
    """``data`` (what ``register_data`` takes, already called) as a ``FederatedDataset``."""
    from fedjax_dp.data import client_data
    from fedjax_dp.data.federated_dataset import FederatedDataset

    if isinstance(data, FederatedDataset):
        ids = data.metadata.get("client_ids", tuple(range(data.num_clients)))
        unit = (
            f"a client is one client of data source {name!r}'s FederatedDataset"
            f" ({data.num_clients}): all the examples of one client are that client's"
        )
        return dataclasses.replace(
            data, metadata={"client_ids": tuple(ids), "privacy_unit": unit, **data.metadata}
        )
    if hasattr(data, "as_data_source") and hasattr(data, "info"):
        from fedjax_dp.data.tfds_clients import tfds_clients

        data, stated = tfds_clients(data, client_feature, x_feature=x_feature, y_feature=y_feature)
        num_classes = num_classes or stated
    if not isinstance(data, Mapping):
        raise ValueError(
            f"data source {name!r} gave {type(data).__name__}, not a mapping from client id to"
            " arrays, a FederatedDataset or a TFDS builder"
        )
    return client_data.from_clients(
        data,
        num_classes=num_classes,
        test_fraction=float(cfg.get("test_fraction", 0.0)),
        seed=seed,
        name=name,
    )
