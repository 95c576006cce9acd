"""Named mechanism choices of a config key (a clip rule of ``dp.clip``, a noise family of
``dp.noise``), registered as algorithms are: each with its builder, what it means, the section keys
it reads and its own checks::

    register_choice("dp", "noise", "laplace", build=build_laplace, doc="Laplace noise (...)",
                    keys={"laplace_scale": (1.0, "b: the Laplace scale over the clip")},
                    validate=check_laplace)

The key's documentation lists every choice, the keys a choice reads are read only while it is
chosen (an override of one otherwise is refused), and the chosen one's checks run with the config's
validation (``core.config_sections``). The owner of the section looks the choice up by name
(``get``); adding a choice edits neither the owner nor ``training/``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from fedjax_dp.core import config_sections


@dataclasses.dataclass(frozen=True)
class Choice:
    """``build``: the choice's builder (its arguments are the owning section's contract);
    ``traits``: what the owner may ask of it (e.g. ``adaptive``, ``fixed_bound``)."""

    section: str
    key: str
    name: str
    build: Callable
    doc: str
    keys: dict
    validate: Callable | None
    traits: dict

    def __getattr__(self, trait):
        traits = self.__dict__.get("traits", {})
        if trait in traits:
            return traits[trait]
        raise AttributeError(trait)


_CHOICES: dict[tuple[str, str], dict[str, Choice]] = {}


def register_choice(
    section: str,
    key: str,
    name: str,
    *,
    build: Callable,
    doc: str,
    keys: dict | None = None,
    validate: Callable | None = None,
    **traits,
) -> Choice:
    """Registers ``name`` as a value of ``section.key`` (module docstring); ``keys``: the section
    keys it reads, {key: (default, meaning)}; ``validate(cfg, need)``: its checks, run when it is
    chosen."""
    choices = _CHOICES.setdefault((section, key), {})
    if name in choices:
        raise ValueError(f"{section}.{key} choice {name!r} is already registered")
    keys = dict(keys or {})
    choices[name] = Choice(section, key, name, build, doc, keys, validate, traits)
    config_sections.register_section(section, {k: default for k, (default, _) in keys.items()})
    _refresh(section, key)
    return choices[name]


def unregister_choice(section: str, key: str, name: str) -> None:
    """Removes a choice and the keys only it read (tests that register a toy choice)."""
    choices = _CHOICES.get((section, key), {})
    choice = choices.pop(name, None)
    if choice is None:
        return
    still = {
        k
        for (s, _), group in _CHOICES.items()
        if s == section
        for c in group.values()
        for k in c.keys
    }
    config_sections.unregister_keys(section, [k for k in choice.keys if k not in still])
    _refresh(section, key)


def names(section: str, key: str) -> tuple[str, ...]:
    return tuple(_CHOICES.get((section, key), {}))


def get(section: str, key: str, name: str) -> Choice:
    choices = _CHOICES.get((section, key), {})
    if name not in choices:
        raise ValueError(f"{section}.{key} {name!r} unknown; available: {names(section, key)}")
    return choices[name]


def _refresh(section: str, key: str) -> None:
    """The key's documentation (every choice, with its meaning), each extra key's meaning and the
    choices under which it is read, and the chosen choice's check."""
    owned = config_sections.sections().get(section)
    if owned is None:
        return
    choices = _CHOICES.get((section, key), {})
    owned.docs[key] = " | ".join(
        f"{c.name} ({c.doc})" if c.doc else c.name for c in choices.values()
    )
    readers: dict[str, list[str]] = {}
    for choice in choices.values():
        for extra, (_, meaning) in choice.keys.items():
            readers.setdefault(extra, []).append(choice.name)
            owned.docs[extra] = meaning
    decider = f"{section}.{key}"
    owned.read_when[:] = [rule for rule in owned.read_when if rule[1] != decider] + [
        (f"{section}.{extra}", decider, tuple(names_)) for extra, names_ in readers.items()
    ]
    check = _checker(section, key)
    if check not in owned.checks:
        owned.checks.append(check)


@functools.lru_cache(maxsize=None)
def _checker(section: str, key: str) -> Callable:
    """The check of ``section.key``: its value is a registered choice, and that choice's own
    checks pass."""

    def check(cfg, need) -> None:
        if section not in cfg or key not in cfg[section]:
            return
        value = cfg[section][key]
        choices = _CHOICES.get((section, key), {})
        if value not in choices:
            need(False, f"{section}.{key} {value!r} unknown; available: {tuple(choices)}")
            return
        if choices[value].validate is not None:
            choices[value].validate(cfg, need)

    return check
