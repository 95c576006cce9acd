"""The generic federated round: one algorithm, one upload chain, one cohort engine.

Per round (written once for every algorithm):
1. every sampled client runs ``algorithm.client_update`` inside the cohort engine (vmap / chunked /
   sequential / loop, optionally over a device mesh);
2. a client whose upload, state or loss is not finite is dropped: its upload is zeroed before any
   transform, its weight is 0, and it is counted and named (``RoundResult.dropped``);
3. the upload transforms' client sides run (clip, local noise, compress), the upload is weighted
   (n_k, or 1 under ``UniformWeights``) and summed inside the engine, so a large cohort never holds
   every update at once (a cohort-level transform, Geyer's median clip, gets the stacked uploads
   instead);
4. the transforms' server sides run in reverse order (central noise, reconstruction) and the sum is
   divided by its denominator into an ``Aggregate`` for ``algorithm.server_update``.

Under several processes (``core.hosts``) every process calls the round with the same cohort, whose
data (``batches``) may hold only this host's rows (``hosts.host_rows``: what ``RunContext`` packs);
the round gives the engine this host's rows of every per-client input and the server step runs on
every process alike.

Compression rates are static shapes: the chain is specialised from its state on the host each round
and one compiled program is kept per distinct specialisation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import hosts, rng, tree
from fedjax_dp.core.algorithm import Aggregate, Algorithm
from fedjax_dp.core.canary_uploads import CanaryCohort, add_canaries, canary_sums
from fedjax_dp.core.cohort import MAX_REPLICATED_BYTES, CohortEngine
from fedjax_dp.core.uploads import (
    UNBOUNDED,
    Chain,
    ClientContext,
    ServerContext,
    bound_after,
    chain,
)

EVALUATION_PASS_KEYS = ("eval_batches", "eval_mask")
"""A cohort packed for UGA also holds each client's whole local data
(``packing.pack_uga_cohort``)."""

CLIENT_STATE = "client_state"
# the chain's per-client states (``Chain.client_state_init``)
UPLOAD_CLIENT_STATE = "upload_client_state"
STEP_NOISE = "step_noise_multiplier"
"""Each client's noise multiplier for its local DP-SGD steps (``Requirements.step_noise``): one
value per cohort slot, chosen by the privacy tracker's ledger before the round
(``PrivacyTracker.step_inputs``) and passed to the round as ``step_noise``."""


def client_inputs(cohort, key: jax.Array, noise_key: jax.Array | None = None) -> dict:
    """The per-client arrays the engine maps over, with one key per client for each client-side
    purpose (``core.rng``'s tree): training and evaluation from ``key``; upload noise and count
    noise from ``noise_key`` (default ``key``)."""
    n = cohort["mask"].shape[0]
    noise_key = key if noise_key is None else noise_key
    per_client = lambda parent, purpose: rng.client_keys(rng.purpose_key(parent, purpose), n)  # noqa: E731
    inputs = {
        "batches": cohort["batches"],
        "mask": cohort["mask"],
        "num_examples": cohort["num_examples"],
        "key": per_client(key, rng.Purpose.CLIENT_TRAINING),
        "eval_key": per_client(key, rng.Purpose.EVALUATION),
        "noise_key": per_client(noise_key, rng.Purpose.CLIENT_NOISE),
        "count_key": per_client(noise_key, rng.Purpose.CLIENT_COUNT_NOISE),
    }
    inputs.update({k: cohort[k] for k in EVALUATION_PASS_KEYS if k in cohort})
    inputs["client_id"] = cohort.get("client_id", np.zeros(n, np.int32))
    return inputs


@dataclasses.dataclass
class RoundResult:
    state: Any
    metrics: dict
    dropped: np.ndarray  # per cohort slot: a real client whose update was not finite (or raised)
    client_states: Any = None  # stacked new per-client states (algorithms with client state)
    # stacked new per-client states of the upload chain (error feedback)
    upload_client_states: Any = None
    # the chain's releases this round (``core.release``)
    releases: list = dataclasses.field(default_factory=list)
    # what the server received: the aggregate's mean, total / denominator (a device array)
    released: Any = None


class FederatedRound:
    """``round(state, cohort, key, round_index, client_states) -> RoundResult`` for one algorithm
    and upload chain. ``init(params, key)`` gives the server state with the chain's state in it."""

    def __init__(
        self,
        algorithm: Algorithm,
        uploads: Chain | tuple = (),
        strategy: str = "vmap",
        chunk_size: int | None = None,
        mesh=None,
        stream_size: int | None = None,
        devices: tuple | None = None,
        max_replicated_bytes: int = MAX_REPLICATED_BYTES,
    ):
        self.algorithm = algorithm
        self.uploads = uploads if isinstance(uploads, Chain) else chain(*uploads)
        if (
            algorithm.requirements.step_noise
            and rng.Purpose.CLIENT_NOISE in self.uploads.key_uses()
        ):
            raise ValueError(
                f"{type(algorithm).__name__} draws its local steps' noise from each client's noise"
                " key, and the upload chain draws local upload noise from it too: a key has one"
                " consumer (core.rng)"
            )
        self._engine_options = dict(
            strategy=strategy,
            chunk_size=chunk_size,
            mesh=mesh,
            stream_size=stream_size,
            devices=devices,
            max_replicated_bytes=max_replicated_bytes,
        )
        # refuses a bad strategy now, not in round 1
        CohortEngine(lambda s, c: (s, c), **self._engine_options)
        self._programs: dict = {}
        self._canary_programs: dict = {}
        self._functions: dict = {}

    def with_algorithm(self, algorithm: Algorithm) -> "FederatedRound":
        """This round (its chain, its cohort engine's options) for another algorithm (a wrapper of
        this one: ``training.run_batch``'s traced learning rates)."""
        return FederatedRound(algorithm, self.uploads, **self._engine_options)

    @property
    def strategy(self) -> str:
        """The cohort engine's strategy (``core.cohort.STRATEGIES``)."""
        return self._engine_options["strategy"]

    @property
    def slot_multiple(self) -> int:
        """What a cohort's slot count must be a multiple of: every device of every process when the
        engine's mesh spans several processes (each host packs an equal share), else 1 (the engine
        pads on its own)."""
        mesh = self._engine_options["mesh"]
        return mesh.devices.size if mesh is not None and mesh.is_multi_process else 1

    @property
    def ran_on_one_device(self) -> bool:
        """Whether a round's cohort ran on one device instead of the configured spread, to save
        memory."""
        return any(engine.ran_on_one_device for engine, _ in self._programs.values())

    def init(self, params, key: jax.Array | None = None):
        state = self.algorithm.init(params, key)
        state = state.replace(uploads=self.uploads.init(self.algorithm.upload_template(params)))
        return jax.device_put(state, jax.local_devices()[0])

    def specialized(self, state) -> Chain:
        """The chain with its static choices made for this round (compression rates, on the
        host)."""
        return self.uploads.specialize(state.uploads)

    def upload_bytes(self, state, template_bytes: int) -> int:
        return self.specialized(state).upload_bytes(template_bytes)

    def __call__(
        self,
        state,
        cohort,
        key: jax.Array,
        round_index: int | None = None,
        client_states=None,
        uploads: Chain | None = None,
        noise_key: jax.Array | None = None,
        upload_client_states=None,
        step_noise=None,
        canaries: CanaryCohort | None = None,
    ) -> RoundResult:
        """``uploads``: the chain already specialised for ``state`` (saves the host-side rate
        computation). ``noise_key``: every DP noise draw of the round derives from it (a separate
        stream, ``core.rng``); ``None`` derives the noise from ``key`` under purposes distinct from
        training. ``upload_client_states``: the cohort's stacked states of the chain
        (``Chain.client_state_init``), where a transform keeps per-client state. ``step_noise``:
        each slot's local DP-SGD noise multiplier, where the algorithm's steps draw noise
        (``Requirements.step_noise``; ``STEP_NOISE``). ``canaries``: canary clients sent through the
        chain beside the cohort (``core.canary_uploads``; an audit's). The result's ``releases`` are
        those of the chain that ran (``Chain.releases`` with the round's states)."""
        noise_key = key if noise_key is None else noise_key
        if self.algorithm.requirements.client_state and client_states is None:
            raise ValueError(
                "this algorithm keeps per-client state: pass the cohort's stacked states "
                "(core.client_states.ClientStateStore.gather) as client_states"
            )
        if self.algorithm.requirements.step_noise and step_noise is None:
            raise ValueError(
                f"{type(self.algorithm).__name__}'s local steps draw DP noise: pass each slot's"
                " noise multiplier as step_noise (the privacy tracker's step_inputs)"
            )
        if self.uploads.keeps_client_state and upload_client_states is None:
            raise ValueError(
                "an upload transform keeps per-client state (error feedback): pass the cohort's"
                " stacked states (ClientStateStore(chain.client_state_init(template)).gather) as"
                " upload_client_states"
            )
        t = int(state.round) + 1 if round_index is None else round_index
        uploads = self.specialized(state) if uploads is None else uploads
        engine, server_step = self._program(uploads)
        inputs = uploads.inputs(t)
        clients = self._clients(
            cohort, key, noise_key, client_states, upload_client_states, step_noise
        )
        releases = uploads.releases(t, state.uploads)  # before the server step changes the states
        engine_clients = (
            _this_host_rows(clients, cohort["mask"].shape[0]) if engine.across_hosts else clients
        )
        sums, per_client = engine(
            (self.algorithm.broadcast(state), state.uploads, inputs), engine_clients
        )
        if canaries is not None:
            canary_fn = self._canary_program(uploads, state, canaries.directions)
            sums = add_canaries(sums, canary_fn(state.uploads, inputs, canaries, noise_key))
        new_state, metrics, released = server_step(
            state,
            sums,
            per_client,
            key,
            noise_key,
            inputs,
            (clients["noise_key"], clients["count_key"]),
        )
        present = np.asarray(cohort["num_examples"]) > 0
        dropped = present & ~np.asarray(per_client["finite"])
        metrics = {**metrics, "dropped_clients": int(dropped.sum())}
        return RoundResult(
            new_state,
            metrics,
            dropped,
            per_client.get(CLIENT_STATE),
            per_client.get(UPLOAD_CLIENT_STATE),
            releases,
            released,
        )

    def _clients(self, cohort, key, noise_key, client_states, upload_client_states, step_noise):
        clients = client_inputs(cohort, key, noise_key)
        if client_states is not None:
            clients[CLIENT_STATE] = client_states
        if self.uploads.keeps_client_state:
            clients[UPLOAD_CLIENT_STATE] = upload_client_states
        if step_noise is not None:
            clients[STEP_NOISE] = np.asarray(step_noise, np.float32)
        return clients

    def function(
        self,
        state,
        cohort,
        key: jax.Array,
        round_index: int | None = None,
        noise_key: jax.Array | None = None,
        client_states=None,
        upload_client_states=None,
        step_noise=None,
        uploads: Chain | None = None,
    ):
        """``(f, args)``: the round as one pure, traceable function ``f(state, *args) -> (new_state,
        metrics)`` of the same clients, keys and chain as ``self(state, cohort, key, ...)`` (the
        same arguments), for differentiating through a round (``hypergrad``).

        ``f`` runs the algorithm's client update and the chain's client sides under ``jax.vmap``
        (no cohort engine: every client's intermediates are held at once, which ``jax.grad``
        needs anyway) and the same server step as the round. Every noise draw comes from the keys
        in ``args``, so with them fixed the noise is a constant of ``f``: its derivative in the
        state is the reparameterised one, noise held fixed. A cohort-level transform is refused
        (its median is not a function to differentiate through)."""
        noise_key = key if noise_key is None else noise_key
        t = int(state.round) + 1 if round_index is None else round_index
        uploads = self.specialized(state) if uploads is None else uploads
        if uploads.split < len(uploads):
            raise ValueError(
                f"the round as a function: the cohort-level transform"
                f" {type(uploads[uploads.split]).__name__} is not supported"
            )
        clients = self._clients(
            cohort, key, noise_key, client_states, upload_client_states, step_noise
        )
        static = uploads.static_key()
        if static not in self._functions:  # one f per specialisation: jit caches on it
            self._functions[static] = self._round_function(uploads)
        return self._functions[static], (clients, key, noise_key, uploads.inputs(t))

    def _round_function(self, uploads: Chain):
        client_fn, server_fn = self._client_fn(uploads), self._server_fn(uploads)
        algorithm = self.algorithm

        def f(state, clients, key, noise_key, inputs):
            shared = (algorithm.broadcast(state), state.uploads, inputs)
            summed, per_client = jax.vmap(client_fn, in_axes=(None, 0))(shared, clients)
            sums = jax.tree_util.tree_map(lambda x: jnp.sum(x, axis=0), summed)
            noise_keys = (clients["noise_key"], clients["count_key"])
            new_state, metrics, _ = server_fn(
                state, sums, per_client, key, noise_key, inputs, noise_keys
            )
            return new_state, metrics

        return f

    def round(self, state, cohort, key: jax.Array, client_states=None):
        """``(new_state, metrics)``: the round without per-slot details, for notebooks and short
        scripts."""
        result = self(state, cohort, key, client_states=client_states)
        return result.state, result.metrics

    def _canary_program(self, uploads: Chain, state, directions: str):
        if uploads.split < len(uploads):
            raise ValueError(
                f"canary clients cannot join a cohort-level transform"
                f" ({type(uploads[uploads.split]).__name__}: it needs every upload stacked)"
            )
        key = (uploads.static_key(), directions)
        if key not in self._canary_programs:
            template = self.algorithm.upload_template(state.params)
            own = (
                self.uploads.client_state_init(template)
                if self.uploads.keeps_client_state
                else None
            )
            self._canary_programs[key] = canary_sums(send, uploads, template, own, directions)
        return self._canary_programs[key]

    def _program(self, uploads: Chain):
        key = uploads.static_key()
        if key not in self._programs:
            engine = CohortEngine(
                self._client_fn(uploads),
                failed_fn=self._failed_client_fn(uploads),
                **self._engine_options,
            )
            self._programs[key] = (engine, jax.jit(self._server_fn(uploads)))
        return self._programs[key]

    def traced_round(self, uploads: Chain):
        """``f(state, clients, key, noise_key, inputs) -> (new_state, metrics, finite, released)``:
        the round as one traceable function under the cohort engine's own traced strategy
        (``sequential``, ``chunked`` or ``vmap``; ``clients``, ``key``, ``noise_key`` and
        ``inputs``: ``function``'s arguments), for runs batched under ``jax.vmap``
        (``training.run_batch``), on one device (the engine's mesh or devices dropped: a batch
        spreads its runs over the devices instead). No fault containment: a failing program
        raises."""
        if uploads.split < len(uploads):
            raise ValueError(
                f"the round as one traced function: the cohort-level transform"
                f" {type(uploads[uploads.split]).__name__} is not supported"
            )
        engine = self._program(uploads)[0]._one_device  # a batch spreads its runs instead
        if engine.strategy not in ("vmap", "chunked", "sequential"):
            raise ValueError(
                f"the round as one traced function needs a traced cohort strategy, not"
                f" {engine.strategy!r}"
            )
        server_fn, algorithm = self._server_fn(uploads), self.algorithm

        def f(state, clients, key, noise_key, inputs):
            shared = (algorithm.broadcast(state), state.uploads, inputs)
            sums, per_client = engine.trace(shared, clients)
            noise_keys = (clients["noise_key"], clients["count_key"])
            new_state, metrics, released = server_fn(
                state, sums, per_client, key, noise_key, inputs, noise_keys
            )
            return new_state, metrics, per_client["finite"], released

        return f

    def client_function(self, uploads: Chain):
        """``client_fn(shared, client) -> (summed, per_client)``: one client's update through the
        client sides of ``uploads`` (``summed['upload']``: what enters the sum), the function the
        cohort engine maps; for derivatives of one client's contribution (``hypergrad``)."""
        return self._client_fn(uploads)

    # ------------------------------------------------------------------ client side
    def _client_fn(self, uploads: Chain):
        algorithm = self.algorithm

        def client_fn(shared, client):
            algorithm_shared, states, inputs = shared
            out = algorithm.client_update(
                algorithm_shared, client, client.get(CLIENT_STATE), client["key"]
            )
            return send(uploads, states, inputs, client, out, out.ok)

        return client_fn

    def _failed_client_fn(self, uploads: Chain):
        """What a client that raised sends (``CohortEngine(failed_fn=)``): a zero update through the
        chain's client sides, so under local noise it sends noise, never exact zeros; it is dropped
        (weight 0, ``finite`` False) like a client whose update is not finite."""
        algorithm = self.algorithm

        def failed_fn(shared, client):
            algorithm_shared, states, inputs = shared
            shapes = jax.eval_shape(
                algorithm.client_update,
                algorithm_shared,
                client,
                client.get(CLIENT_STATE),
                client["key"],
            )
            out = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            if client.get(CLIENT_STATE) is not None:  # the old state, unchanged
                out = out._replace(client_state=client[CLIENT_STATE])
            summed, per_client = send(uploads, states, inputs, client, out, jnp.bool_(False))
            return summed, {**per_client, "finite": jnp.bool_(False)}

        return failed_fn

    # ------------------------------------------------------------------ server side
    def _server_fn(self, uploads: Chain):
        algorithm, split, weighting = self.algorithm, uploads.split, uploads.weighting

        def server_fn(state, sums, per_client, key, noise_key, inputs, noise_keys):
            states = state.uploads
            kept = per_client["kept"]
            present = per_client["present"]
            stats, extras = list(per_client["stats"]), list(sums["extras"])
            bounds, bound = [], jnp.float32(UNBOUNDED)
            for i, t in enumerate(uploads[:split]):
                bounds.append(bound)
                bound = bound_after(t, bound, states[i], inputs[i])
            total = sums.get("upload")
            if split < len(uploads):
                total, bound, tail_stats = _cohort_level(
                    uploads,
                    split,
                    states,
                    inputs,
                    bound,
                    key,
                    noise_key,
                    kept,
                    per_client,
                    noise_keys,
                    bounds,
                )
                stats += tail_stats
                extras += [{}] * (len(uploads) - split)
            new_states, metrics = list(states), {}
            for i in reversed(range(len(uploads))):
                ctx = ServerContext(
                    states[i],
                    inputs[i],
                    bounds[i],
                    key,
                    extras[i],
                    stats[i],
                    present,
                    kept,
                    noise_key,
                )
                total, new_states[i], transform_metrics = uploads[i].server(total, ctx)
                metrics.update(transform_metrics)
            weight = sums["weight"]
            received = weight + sums.get("canary_weight", 0.0)  # canaries count in a mean
            fixed = weighting is not None and weighting.denominator > 0
            if fixed and weighting.schedule:  # D_t of a rate schedule, a traced input
                denominator = inputs[list(uploads).index(weighting)]["denominator"]
            else:
                denominator = (
                    jnp.float32(weighting.denominator) if fixed else jnp.maximum(received, 1e-12)
                )
            aggregate = Aggregate(total, denominator, jnp.sum(kept), fixed)
            released = jax.tree_util.tree_map(lambda x: x / denominator, total)
            new_state, algorithm_metrics = algorithm.server_update(
                state.replace(uploads=tuple(new_states)), aggregate, key
            )
            metrics.update(algorithm_metrics)
            metrics["train_loss"] = sums["loss"] / jnp.maximum(weight, 1e-12)
            if "data_loss" in sums:
                metrics["train_data_loss"] = sums["data_loss"] / jnp.maximum(weight, 1e-12)
            if not uploads.releases_anything:
                metrics["mean_update_norm"] = _masked_mean(per_client["update_norm"], kept)
            return new_state, metrics, released

        return server_fn


def send(uploads: Chain, states, inputs, client, out, ok):
    """A client's ``ClientOut`` through the client sides of the chain: zeroed unless ``ok`` and
    real, clipped, noised, compressed, weighted (see the module docstring, steps 2-3)."""
    split, uniform = uploads.split, uploads.weighting is not None
    present = client["num_examples"] > 0
    keep = ok & present
    upload = tree.where(keep, out.upload, jax.tree_util.tree_map(jnp.zeros_like, out.upload))
    bound, extras, stats = jnp.float32(UNBOUNDED), [], []
    client_states = client.get(UPLOAD_CLIENT_STATE)
    new_client_states = [None] * len(uploads)
    for i, t in enumerate(uploads[:split]):
        own = client_states[i] if client_states is not None else None
        flow = t.client(
            upload,
            ClientContext(
                states[i],
                inputs[i],
                bound,
                client["noise_key"],
                present,
                keep,
                client["client_id"],
                own,
                client["count_key"],
            ),
        )
        upload, bound = flow.upload, flow.bound
        extras.append(flow.extras)
        stats.append(flow.stats)
        new_client_states[i] = flow.client_state
    weight = (
        keep.astype(jnp.float32)
        if uniform
        else jnp.where(keep, out.weight.astype(jnp.float32), 0.0)
    )
    summed = {"weight": weight, "loss": jnp.where(keep, out.loss * weight, 0.0), "extras": extras}
    if out.data_loss is not None:
        summed["data_loss"] = jnp.where(keep, out.data_loss * weight, 0.0)
    per_client = {
        "finite": ok | ~present,
        "kept": keep,
        "present": present,
        "stats": stats,
        "update_norm": tree.l2_norm(upload),
    }
    if split == len(uploads):
        summed["upload"] = jax.tree_util.tree_map(lambda u: _weighted(u, weight, keep), upload)
    else:
        per_client["upload"] = upload
    if out.client_state is not None:
        per_client[CLIENT_STATE] = out.client_state
    if client_states is not None:
        per_client[UPLOAD_CLIENT_STATE] = tuple(new_client_states)
    return summed, per_client


def _weighted(upload, weight, keep):
    """A client's weighted upload; an integer upload (a modular share under simulated secure
    aggregation) is kept exact: it enters the sum whole or not at all (its weight must be 0 or
    1), so the engine's integer sum wraps as modular arithmetic does."""
    if jnp.issubdtype(upload.dtype, jnp.integer):
        return jnp.where(keep, upload, jnp.zeros_like(upload))
    return upload * weight


def _this_host_rows(clients, num_slots: int):
    """This process's rows of every per-client input: a leaf holding every slot is cut to
    ``hosts.host_rows``, one packed on this host alone (``batches``) already holds only them."""
    rows = hosts.host_rows(num_slots)
    share = rows.stop - rows.start

    def cut(x):
        if x.shape[0] == num_slots:
            return x[rows]
        if x.shape[0] == share:
            return x
        raise ValueError(
            f"a per-client input has {x.shape[0]} rows: neither the cohort's {num_slots} slots nor "
            f"this host's {share}"
        )

    return jax.tree_util.tree_map(cut, clients)


def _masked_mean(values, mask):
    return jnp.sum(jnp.where(mask, values, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def _cohort_level(
    uploads: Chain,
    split: int,
    states,
    inputs,
    bound,
    key,
    noise_key,
    kept,
    per_client,
    noise_keys,
    bounds,
):
    """A cohort-level transform (server-side clip) on the stacked uploads, then the client sides of
    the transforms after it (vmapped over the cohort) and the sum. Weights are uniform here
    (``chain`` requires them with any clip), so the sum is over kept clients."""
    t = uploads[split]
    ctx = ServerContext(states[split], inputs[split], bound, key, {}, {}, kept, kept, noise_key)
    stacked, bound, cohort_stats = t.cohort(per_client["upload"], ctx)
    bounds.append(ctx.bound)
    stats = [cohort_stats]
    for i in range(split + 1, len(uploads)):
        bounds.append(bound)

        def one(upload, noise_key, count_key, keep, i=i, bound=bound):
            flow = uploads[i].client(
                upload,
                ClientContext(
                    states[i], inputs[i], bound, noise_key, keep, keep, count_key=count_key
                ),
            )
            return flow.upload, flow.stats

        stacked, transform_stats = jax.vmap(one)(stacked, *noise_keys, kept)
        bound = bound_after(uploads[i], bound, states[i], inputs[i])
        stats.append(transform_stats)
    total = jax.tree_util.tree_map(
        lambda u: jnp.sum(jnp.where(_rows(kept, u), u, 0.0), axis=0), stacked
    )
    return total, bound, stats


def _rows(mask, x):
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))
