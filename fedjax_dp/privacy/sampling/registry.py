"""The sampler registry and the ``sampling`` config section it owns.

A sampler is the object that draws a round's cohort and states that round's accounting event, so
sampling and accounting cannot be mismatched. Each registers under its ``sampling.method`` name
with the section keys it reads (defaults and meanings), its own checks, and a builder::

    register_sampler("poisson", build=lambda s, n: PoissonSampling(n, s.rate),
                     keys={"rate": (0.1, "probability q that a client takes part in a round")},
                     validate=check_poisson)

and the training loop and the ledgers ask the sampler (``Sampler``), never the method's name; a
test file can register a toy sampler the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

import numpy as np

from fedjax_dp.core import config_sections


class Sampler(Protocol):
    """What the loop and the ledgers ask of a sampler."""

    num_clients: int
    relation: str  # the neighbouring relation its event is stated for: "add/remove-one", ...

    def sample(self, rng: np.random.Generator, eligible=None, t: int = 1) -> np.ndarray: ...

    def expected_cohort(self, t: int | None = None) -> float: ...  # the fixed denominator

    def denominators(self) -> tuple: ...  # ((first round, D_t), ...), () for a constant one

    def slots(self, drawn: int = 0) -> int | None: ...  # packing capacity (None: the cohort)

    def capacity(self) -> int: ...  # the most clients a round can hold

    def sized_by(self) -> str: ...  # the config keys that set ``capacity``, with their values

    def can_draw(self, eligible: np.ndarray) -> bool: ...  # enough eligible clients for a round

    def rate_at(self, t: int | None) -> float: ...  # the chance a client is in round t

    def round_event(self, mechanism, t: int | None = None, eligible: int | None = None): ...

    def describe(self) -> str: ...

    def accounting_notes(self) -> tuple[str, ...]: ...


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    build: Callable  # build(section, num_clients) -> Sampler
    keys: dict  # key -> (default, meaning)
    validate: Callable | None = None  # validate(cfg, need)
    participation: bool = False  # a participation scheme that correlated noise is calibrated for
    summary: str = ""


_ENTRIES: dict[str, Entry] = {}
SECTION = "sampling"
METHOD_DOC = "how a round's cohort is drawn: {names} (each sampler's keys below)"


def register_sampler(
    name: str,
    *,
    build: Callable,
    keys: dict | None = None,
    validate: Callable | None = None,
    participation: bool = False,
    summary: str = "",
) -> Entry:
    """Registers sampler ``name`` (``sampling.method=name``): ``build(section, num_clients)``, the
    ``sampling`` keys it reads as {key: (default, meaning)} (a key several samplers read is
    registered by each with the same default), ``validate(cfg, need)`` run when it is chosen."""
    if name in _ENTRIES:
        raise ValueError(f"sampler {name!r} is already registered")
    keys = dict(keys or {})
    config_sections.register_section(
        SECTION, {"method": "uniform", **{k: default for k, (default, _) in keys.items()}}
    )
    _ENTRIES[name] = Entry(name, build, keys, validate, participation, summary)
    _refresh_section()
    return _ENTRIES[name]


def unregister_sampler(name: str) -> None:
    """Removes a sampler and the keys only it read (tests that register a toy sampler)."""
    entry = _ENTRIES.pop(name, None)
    if entry is None:
        return
    others = {k for e in _ENTRIES.values() for k in e.keys}
    config_sections.unregister_keys(SECTION, [k for k in entry.keys if k not in others])
    _refresh_section()


def _refresh_section() -> None:
    """The section's docs (each key's meaning for each sampler that reads it) and conditional keys,
    from the samplers registered."""
    section = config_sections.sections().get(SECTION)
    if section is None:
        return
    summaries = "; ".join(f"{e.name}: {e.summary}" for e in _ENTRIES.values() if e.summary)
    section.docs["method"] = METHOD_DOC.format(names=" | ".join(_ENTRIES)) + (
        f" ({summaries})" if summaries else ""
    )
    readers: dict[str, list[str]] = {}
    meanings: dict[str, list[str]] = {}
    for entry in _ENTRIES.values():
        for key, (_, meaning) in entry.keys.items():
            readers.setdefault(key, []).append(entry.name)
            if meaning not in meanings.setdefault(key, []):
                meanings[key].append(meaning)
    for key, texts in meanings.items():
        section.docs[key] = "; ".join(texts)
    section.read_when[:] = [
        (f"{SECTION}.{key}", f"{SECTION}.method", tuple(names)) for key, names in readers.items()
    ]
    if _check not in section.checks:
        section.checks.append(_check)


def names() -> tuple[str, ...]:
    return tuple(_ENTRIES)


def participation_schemes() -> tuple[str, ...]:
    """The methods that are participation schemes correlated noise is calibrated for."""
    return tuple(n for n, e in _ENTRIES.items() if e.participation)


def get(name: str) -> Entry:
    if name not in _ENTRIES:
        raise ValueError(f"sampling.method {name!r} unknown; available: {names()}")
    return _ENTRIES[name]


def build(section, num_clients: int) -> Sampler:
    """The sampler a config's ``sampling`` section describes."""
    return get(section.method).build(section, num_clients)


def _check(cfg, need) -> None:
    """The chosen sampler's own checks."""
    method = cfg.sampling.method
    if method not in _ENTRIES:
        need(False, f"sampling.method {method!r} unknown; available: {names()}")
        return
    entry = _ENTRIES[method]
    if entry.validate is not None:
        entry.validate(cfg, need)
