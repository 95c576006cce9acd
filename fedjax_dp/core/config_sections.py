"""The registry of owned config sections: each part of the library that has options (an algorithm,
a sampler, compression, a noise family) registers its section of the config here, with its
defaults, what each key means, its own validation and the keys read only under another key's
value. ``training.default_config`` builds the config from it, ``fedjax-dp --help`` prints its
docs, and config validation calls its checks, so ``training/`` names none of these keys.

A section may be extended by several owners (each sampler adds the keys it reads to ``sampling``);
a key belongs to the owner that registered it, and registering it again with another default is
refused.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

Validate = Callable  # validate(cfg, need): need(ok, message) for each rule


@dataclasses.dataclass
class Section:
    name: str
    defaults: dict = dataclasses.field(default_factory=dict)
    docs: dict = dataclasses.field(default_factory=dict)
    checks: list = dataclasses.field(default_factory=list)
    read_when: list = dataclasses.field(default_factory=list)
    switch: str | None = None  # an on/off section: the key that turns it on ("enabled")


_SECTIONS: dict[str, Section] = {}


def register_section(
    name: str,
    defaults: dict,
    docs: dict | None = None,
    validate: Validate | None = None,
    read_when: tuple = (),
    switch: str | None = None,
) -> Section:
    """Registers (or extends) section ``name``: ``defaults`` (key -> default), ``docs`` (key ->
    meaning), ``validate(cfg, need)``, ``read_when`` ((dotted key, deciding dotted key, the values
    under which the first is read), ...) and ``switch`` (the key of an on/off section)."""
    section = _SECTIONS.setdefault(name, Section(name))
    for key, value in defaults.items():
        if key in section.defaults and section.defaults[key] != value:
            raise ValueError(
                f"config key {name}.{key} is already registered with default"
                f" {section.defaults[key]!r}, not {value!r}"
            )
    section.defaults.update(defaults)
    section.docs.update(docs or {})
    if validate is not None and validate not in section.checks:
        section.checks.append(validate)
    section.read_when.extend(rule for rule in read_when if rule not in section.read_when)
    if switch is not None:
        section.switch = switch
    return section


def unregister_keys(name: str, keys) -> None:
    """Removes keys (and their docs) from a section, the section itself once empty (tests that
    register a toy owner clean up with this)."""
    section = _SECTIONS.get(name)
    if section is None:
        return
    for key in keys:
        section.defaults.pop(key, None)
        section.docs.pop(key, None)
    section.read_when[:] = [r for r in section.read_when if r[0].split(".")[1] not in keys]
    if not section.defaults:
        _SECTIONS.pop(name)


def remove_check(name: str, validate: Validate) -> None:
    section = _SECTIONS.get(name)
    if section is not None and validate in section.checks:
        section.checks.remove(validate)


def sections() -> dict[str, Section]:
    return dict(_SECTIONS)


def docs() -> dict[str, str]:
    """Every registered key's meaning, by dotted key."""
    return {f"{s.name}.{k}": text for s in _SECTIONS.values() for k, text in s.docs.items()}


def read_when() -> tuple:
    return tuple(rule for s in _SECTIONS.values() for rule in s.read_when)


def validate(cfg, need, unread: Callable = lambda name: False) -> None:
    """Every registered section's own checks (an on/off section's check reads its switch), but for
    the sections ``unread(name)`` says the run does not read (an algorithm's section under another
    algorithm)."""
    for section in list(_SECTIONS.values()):
        if section.name in cfg and not unread(section.name):
            for check in section.checks:
                check(cfg, need)
