"""Upload transforms: what happens to a client's upload between ``client_update`` and the server
step, composed like ``optax.chain``, each declaring what it releases.

A transform has a client side (inside the cohort map: clip, local noise, compress) run in chain
order, an optional cohort side (on the stacked uploads at the server before summing: Geyer's median
clip, which needs every norm) and a server side (on the summed uploads: central noise,
reconstruction) run in REVERSE chain order, as a decoder undoes the last encoding first:
``chain(clip, compress, gaussian)`` clips x, measures y = Phi x, noises y, and the server noises the
sum of y before reconstructing it.

Each transform declares ``releases``: the mechanisms it runs in a round (``core.release.Release``:
its dp_accounting event, sensitivity and neighbouring relation, central or local, formal or not).
The round returns the releases of the chain that ran (``Chain.releases`` with the round's states, so
a bound that is state, an adaptive clip's, is a number); the privacy tracker composes those; nothing
re-derives them from the configuration.

A transform may keep per-client state between rounds (``PerClientStateful``: error feedback's
residual): the loop stores it per client like an algorithm's (``core.client_states``), the round
passes each client its own in ``ClientContext.client_state`` and keeps the ``Flow.client_state`` it
returns.

The per-client L2 bound flows forward through the chain: it starts unbounded, a clip sets it, a
noise transform calibrates its standard deviation to it (std = z * bound), a transform that changes
norms maps it (``bound_after``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

# re-exported: transforms state releases
from fedjax_dp.core.release import Claim, Release  # noqa: F401
from fedjax_dp.core.schedules import schedule_value

UNBOUNDED = math.inf


class ClientContext(NamedTuple):
    state: Any  # this transform's state (broadcast)
    inputs: dict  # this transform's per-round values (e.g. z_t)
    bound: Any  # the per-client L2 bound of the incoming upload (a traced scalar; inf = unbounded)
    noise_key: Any  # this client's noise key (upload noise: its one consumer, ``core.rng``)
    present: Any  # a real client (not a padding slot)
    keep: Any  # present and finite: its upload enters the sum
    client_id: Any = 0  # the client's population index (0 in padding slots): per-client mechanisms
    # this transform's state for this client (``client_state_init``; None: none)
    client_state: Any = None
    # this client's count-noise key (a local adaptive clip's counts: ``core.rng``)
    count_key: Any = None


class ServerContext(NamedTuple):
    state: Any
    inputs: dict
    bound: Any  # the per-client bound of what this transform's client side emitted
    key: Any  # the round's key (a transform derives its purpose key from it; noise: ``noise_key``)
    extras: dict  # this transform's summed extras
    stats: dict  # this transform's per-client stats, stacked over the cohort
    present: Any  # stacked: real clients
    kept: Any  # stacked: uploads that entered the sum
    noise_key: Any = None  # the round's noise key (central noise, a released count): its own stream


class Flow(NamedTuple):
    """A client-side result: the upload, its bound, summed extras, per-client stats and, for a
    transform with per-client state, the client's new state (kept only if its upload is: a dropped
    client keeps its old one)."""

    upload: Any
    bound: Any
    extras: dict = {}
    stats: dict = {}
    client_state: Any = None


@dataclasses.dataclass(frozen=True)
class UploadTransform:
    """The required core of every upload transform (the identity, releasing nothing, by default):
    its ``kind``, its ``client`` side, its ``server`` side and the ``releases`` it states. What a
    transform does beyond that it declares by subclassing a capability below (``Stateful``,
    ``PerClientStateful``, ``Scheduled``, ``Specialized``, ``BoundMapping``, ``CohortLevel``,
    ``KeyDrawing``, ``Resizing``); the chain asks only the transforms that declare one."""

    kind: ClassVar[str] = "identity"  # clip | noise | compress | weighting | diagnostic | declared

    def client(self, upload, ctx: ClientContext) -> Flow:
        return Flow(upload, ctx.bound)

    def server(self, total, ctx: ServerContext):
        """``(total, new_state, metrics)`` from the summed uploads."""
        return total, ctx.state, {}

    def releases(self, inputs: dict, bound: float = math.nan) -> tuple[Release, ...]:
        """The mechanisms this transform runs with ``inputs``; ``bound``: the per-client L2 bound of
        the upload it receives, as a number where the chain knows it (``Chain.releases`` with the
        states), else nan."""
        return ()


class Stateful:
    """Keeps server state between rounds (an adaptive clip's norm, a noise stream's buffers),
    carried in ``ServerState.uploads`` and checkpointed with the model."""

    def init(self, upload_template) -> Any:
        raise TypeError(f"{type(self).__name__} declares Stateful and must define init")


class PerClientStateful:
    """Each client keeps state for this transform between rounds (error feedback's residual): the
    loop stores it per client like an algorithm's (``core.client_states``); ``keeps_client_state``
    says whether this instance does (a compressor without error feedback does not)."""

    @property
    def keeps_client_state(self) -> bool:
        return True

    def client_state_init(self, upload_template) -> Any:
        raise TypeError(
            f"{type(self).__name__} declares PerClientStateful: define client_state_init"
        )


class Scheduled:
    """Has host-side per-round values passed to both sides (traced, so a schedule does not
    recompile)."""

    def inputs(self, round_index: int) -> dict:
        return {}


class Specialized:
    """Makes static choices from its state on the host before a round (compression rates); the
    round's program is compiled once per ``static_key``."""

    def specialize(self, state) -> "UploadTransform":
        return self

    def static_key(self) -> tuple:
        return ()


class RunVarying:
    """Has fields that runs trained as one vmapped program (``training.run_batch``) may differ in.
    ``run_varying`` names them: a number among them reaches the program as a traced input of the
    same name (``varying_inputs``), which the transform's sides read with ``varying``; any other
    (a schedule, a release's text) must reach the program through ``Scheduled.inputs`` or not at
    all. Runs alone keep the field a constant of their program."""

    run_varying: ClassVar[tuple] = ()


def varying(t: UploadTransform, inputs: dict, name: str):
    """``t``'s field ``name`` as the round sees it: the traced input of a batch of runs where one
    is given (``RunVarying``), else the field."""
    return inputs.get(name, getattr(t, name))


def varying_inputs(t: UploadTransform) -> dict:
    """The numbers among ``t``'s ``run_varying`` fields, as a batch of runs passes them."""
    names = t.run_varying if isinstance(t, RunVarying) else ()
    return {n: getattr(t, n) for n in names if isinstance(getattr(t, n), (int, float))}


def program_fields(t: UploadTransform) -> tuple:
    """``(name, value)`` of every field of ``t`` that its program holds as a constant: runs whose
    chains agree in these may share one program (``training.run_batch``)."""
    free = t.run_varying if isinstance(t, RunVarying) else ()
    return tuple((f.name, getattr(t, f.name)) for f in dataclasses.fields(t) if f.name not in free)


class BoundMapping:
    """Changes the per-client L2 bound of what it passes on (a clip sets it, compression maps
    it)."""

    def bound_after(self, bound, state, inputs):
        return bound


class CohortLevel:
    """Runs on the stacked uploads at the server before summing (Geyer's median clip, which needs
    every norm); the client sides before it run per client."""

    def cohort(self, uploads, ctx: ServerContext):
        """``(uploads, bound, stats)`` from the stacked, zeroed uploads."""
        return uploads, ctx.bound, {}


class KeyDrawing:
    """Draws randomness from round keys (``core.rng.Purpose``: ``CLIENT_NOISE`` is
    ``ClientContext.noise_key``, ``CLIENT_COUNT_NOISE`` its ``count_key``, ``SERVER_NOISE`` and
    ``CLIP_ADAPTATION`` purposes of ``ServerContext.noise_key``). Each key has one consumer, so a
    chain refuses two transforms that name the same one."""

    def key_uses(self) -> tuple:
        return ()


class Resizing:
    """Changes the size of what one client sends (compression)."""

    def upload_bytes(self, template_bytes: int) -> int:
        return template_bytes


def state_init(t: UploadTransform, upload_template) -> Any:
    return t.init(upload_template) if isinstance(t, Stateful) else ()


def keeps_client_state(t: UploadTransform) -> bool:
    return isinstance(t, PerClientStateful) and t.keeps_client_state


def client_state_init(t: UploadTransform, upload_template) -> Any:
    return t.client_state_init(upload_template) if keeps_client_state(t) else None


def inputs_of(t: UploadTransform, round_index: int) -> dict:
    return t.inputs(round_index) if isinstance(t, Scheduled) else {}


def bound_after(t: UploadTransform, bound, state, inputs):
    return t.bound_after(bound, state, inputs) if isinstance(t, BoundMapping) else bound


def key_uses(t: UploadTransform) -> tuple:
    return t.key_uses() if isinstance(t, KeyDrawing) else ()


@dataclasses.dataclass(frozen=True)
class UniformWeights(Scheduled, UploadTransform):
    """Every kept client weighs 1 and the sum is divided by ``denominator`` when it is > 0, else by
    the count of kept clients. Bounded-sensitivity mechanisms need it: an example-weighted upload
    n_k Delta_k is not bounded by a clip of Delta_k."""

    kind: ClassVar[str] = "weighting"
    denominator: float = 0.0  # > 0: fixed (DP-FedAvg's m or qK, never the realised count)
    # ((first round, D_t), ...): a fixed denominator per round (q_t K of a rate schedule)
    schedule: tuple = ()

    def __post_init__(self):
        if not self.denominator >= 0:
            raise ValueError(
                f"fixed denominator must be > 0 (0 = count of kept clients), got {self.denominator}"
            )
        if self.schedule and not (self.denominator > 0 and all(d > 0 for _, d in self.schedule)):
            raise ValueError(
                f"a denominator schedule needs fixed denominators > 0, got {self.schedule!r}"
            )

    def inputs(self, round_index: int) -> dict:
        """Round t's fixed denominator D_t where it follows a schedule (traced: one program for
        every D_t)."""
        return {"denominator": schedule_value(self.schedule, round_index)} if self.schedule else {}


def fixed_denominator(denominator: float, schedule: tuple = ()) -> UniformWeights:
    """Geyer et al. / McMahan et al. 2018: divide the clipped sum by a FIXED D (m for fixed-size
    sampling, qK for Poisson sampling), so the realised cohort size is never released; ``schedule``
    ((first round, D_t), ...): Geyer et al.'s 1 / m_t with m_t = q_t K of a sampling-rate
    schedule."""
    if not denominator > 0:
        raise ValueError(f"fixed denominator must be > 0, got {denominator}")
    return UniformWeights(float(denominator), tuple((int(t), float(d)) for t, d in schedule))


@dataclasses.dataclass(frozen=True)
class DeclaredReleases(UploadTransform):
    """Passes uploads on unchanged and declares releases that run beside the chain on the round's
    cohort (a wrapper's own: ``hypergrad.source=clients``'s hyper-gradients), so every reader of
    ``Chain.releases`` (the tracker's budget checks and records, the privacy plan,
    ``privacy.json``) composes them with the chain's. Whoever declares them adds their noise."""

    kind: ClassVar[str] = "declared"
    declared: tuple = ()

    def releases(self, inputs: dict, bound: float = math.nan) -> tuple[Release, ...]:
        return tuple(self.declared)


def _traced_input(value):
    """A transform's per-round input as the round receives it: host numbers as float32 (one program
    for every value), device arrays (a materialised measurement matrix) as they are, tuples
    element-wise."""
    if isinstance(value, tuple):
        return tuple(_traced_input(v) for v in value)
    if value is None or isinstance(value, jax.Array):
        return value
    return jnp.float32(value)


class Chain(tuple):
    """An ordered tuple of upload transforms, validated on construction (``chain(...)``)."""

    @property
    def weighting(self) -> UniformWeights | None:
        found = [t for t in self if isinstance(t, UniformWeights)]
        return found[0] if found else None

    def init(self, upload_template) -> tuple:
        return tuple(state_init(t, upload_template) for t in self)

    def client_state_init(self, upload_template) -> tuple | None:
        """Per transform, each client's initial state; None when no transform keeps per-client
        state."""
        if not self.keeps_client_state:
            return None
        return tuple(client_state_init(t, upload_template) for t in self)

    @property
    def keeps_client_state(self) -> bool:
        return any(keeps_client_state(t) for t in self)

    def inputs(self, round_index: int) -> tuple:
        return tuple(
            {k: _traced_input(v) for k, v in inputs_of(t, round_index).items()} for t in self
        )

    def specialize(self, states) -> "Chain":
        return Chain(
            t.specialize(s) if isinstance(t, Specialized) else t for t, s in zip(self, states)
        )

    def static_key(self) -> tuple:
        return tuple(
            (type(t).__name__, t.static_key() if isinstance(t, Specialized) else ()) for t in self
        )

    def releases(self, round_index: int, states=None) -> list[Release]:
        """Every transform's releases in round ``round_index``; with the chain's ``states`` (the
        server state's ``uploads``) each is given the numeric bound of what it receives (an adaptive
        clip's current norm)."""
        out, bound = [], UNBOUNDED if states is not None else math.nan
        for i, t in enumerate(self):
            inputs = inputs_of(t, round_index)
            out += t.releases(inputs, bound)
            if states is not None:
                traced = {k: _traced_input(v) for k, v in inputs.items()}
                bound = float(bound_after(t, bound, states[i], traced))
        return out

    def key_uses(self) -> tuple:
        """Every round key the chain's transforms draw from (``UploadTransform.key_uses``)."""
        return tuple(use for t in self for use in key_uses(t))

    def upload_bytes(self, template_bytes: int) -> int:
        for t in self:
            if isinstance(t, Resizing):
                template_bytes = t.upload_bytes(template_bytes)
        return template_bytes

    @property
    def releases_anything(self) -> bool:
        """Whether a clip or noise transform is in the chain (a private run)."""
        return any(t.kind in ("clip", "noise") for t in self)

    @property
    def split(self) -> int:
        """Index of the cohort-level transform (len(self) if none): client sides before it run per
        client."""
        return next((i for i, t in enumerate(self) if isinstance(t, CohortLevel)), len(self))


CHAIN_RULES: list = []
"""Further checks a chain must pass, registered by the layers that know them
(``register_chain_rule``): the privacy rules live in ``privacy.mechanisms.chain_rules``, not
here."""


def register_chain_rule(rule):
    """Adds ``rule(transforms, names)`` (it raises ``ValueError`` for a composition it refuses) to
    every ``chain()``."""
    if rule not in CHAIN_RULES:
        CHAIN_RULES.append(rule)
    return rule


def chain(*transforms: UploadTransform) -> Chain:
    """Composes upload transforms; refuses compositions that make no sense.

    Refused here: anything but upload transforms, more than one weighting, compressor or
    cohort-level transform, two transforms drawing one key, and per-client state after the
    server-side clip. The privacy rules (a noise transform without a clip before it, two noise
    transforms, a clip or noise without uniform weights, central noise divided by the realised
    count, compression between the clip and the noise, local noise after a server-side clip) are
    registered by ``privacy.mechanisms.chain_rules`` (``CHAIN_RULES``).

    DP-FedAvg's chain (Geyer et al. 2017, Alg. 1: clip to S, Gaussian noise of std z S on the sum,
    divide by the fixed expected cohort), and a chain refused before anything runs:

    >>> from fedjax_dp.privacy import FlatClip, GaussianNoise
    >>> dp_fedavg = chain(FlatClip(1.0), GaussianNoise(((1, 1.0),)), fixed_denominator(100.0))
    >>> [type(t).__name__ for t in dp_fedavg]
    ['FlatClip', 'GaussianNoise', 'UniformWeights']
    >>> chain(GaussianNoise(((1, 1.0),)), FlatClip(1.0))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: upload chain chain(GaussianNoise, FlatClip): noise before any clip ...
    """
    for t in transforms:
        if not isinstance(t, UploadTransform):
            raise TypeError(f"chain() takes upload transforms, got {type(t).__name__}: {t!r}")
    kinds = [t.kind for t in transforms]
    for kind in ("weighting", "compress"):
        if kinds.count(kind) > 1:
            raise ValueError(
                f"upload chain {_names(transforms)} has {kinds.count(kind)} {kind} transforms; at"
                " most one"
            )
    if sum(isinstance(t, CohortLevel) for t in transforms) > 1:
        raise ValueError(f"upload chain {_names(transforms)} has more than one server-side clip")
    uses = [use for t in transforms for use in key_uses(t)]
    shared = sorted({use.name for use in uses if uses.count(use) > 1})
    if shared:
        raise ValueError(
            f"upload chain {_names(transforms)}: more than one transform draws from the {shared}"
            " key; a key has one consumer (core.rng), so two such transforms would share their"
            " noise"
        )
    split = next(
        (i for i, t in enumerate(transforms) if isinstance(t, CohortLevel)), len(transforms)
    )
    stateful = [t for t in transforms[split:] if keeps_client_state(t)]
    if stateful:
        raise ValueError(
            f"upload chain {_names(transforms)}: {type(stateful[0]).__name__} keeps per-client"
            " state, which only a transform before the server-side clip can (those run per client)"
        )
    for rule in CHAIN_RULES:
        rule(transforms, _names(transforms))
    return Chain(transforms)


def _names(transforms) -> str:
    return "chain(" + ", ".join(type(t).__name__ for t in transforms) + ")"
