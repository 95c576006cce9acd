"""The cohort engine: run one pure client function over a sampled cohort and reduce.

A client function maps ``(shared, client) -> (summed, per_client)``: ``summed`` is a pytree the
engine adds up over the cohort (e.g. clipped, weighted updates), ``per_client`` a pytree it stacks
(small per-client scalars: loss, norm, example count). Reducing inside the engine means a cohort of
thousands of clients never materialises thousands of model-sized updates at once.

Strategies, interchangeable and giving the same numbers up to float summation order:

* ``vmap``: one XLA program over all clients (the accelerator path; memory grows with the cohort).
* ``chunked``: ``vmap`` over chunks of ``chunk_size`` clients inside ``lax.scan``: bounded memory.
* ``sequential``: clients one after another inside one jitted ``lax.scan``.
* ``loop``: a jitted per-client function called from Python (no cohort-sized program at all). With
  ``devices``, clients go round-robin to those devices, one in flight on each: on XLA:CPU each host
  device is a core's worth of work, and two clients on two cores ran a small-batch CNN 1.4x faster
  than one client threaded over both (``benchmarks/RESULTS.md``). The sums are still added in client
  order on the first device, so the result is the one-device loop's, bit for bit.

Spreading copies the shared inputs (model, server state, the round's inputs) onto every device:
XLA:CPU's host devices do not share buffers. Where those copies would exceed
``max_replicated_bytes`` together, the cohort runs on the first device alone, more slowly (the
loop's numbers bit for bit; a mesh's up to the float order of its sum): CUAG-PFL's held Gaussian
matrix for ``cnn_pfl``'s dense layer (8 GB) was copied to the second core's device and took a Table
7 run to 21.6 GB (14.6 GB without the copy).

Faults: a client that raises is contained: ``loop`` catches it per client; a traced program that
fails at run time (an XLA error such as running out of memory) is rerun one client at a time, so the
failing client is found and dropped (``per_client['finite']`` False) while the others count.

A ``jax.sharding.Mesh`` with a ``clients`` axis spreads the cohort over devices with ``shard_map``;
each device runs the chosen strategy on its shard and the sums are combined with ``psum``.

The engine's outputs are on the first device (under a mesh too), where the caller's server step
runs.

Several hosts (``jax.distributed``; ``core.hosts``): a mesh over every process's devices. Each
process calls the engine with only its own rows of the cohort (``hosts.host_rows``; every host holds
the same number, a multiple of its devices), the engine assembles them into global arrays
(``jax.make_array_from_process_local_data``), runs the one program (the ``psum`` crosses hosts), and
returns the sums on this process's first device and every client's per-client rows on every process
(``hosts.gather_rows``). There is no fault containment across hosts (a rerun on one host alone would
leave the others waiting): a failing program raises on every process. The sums are added across
processes in another order than one process adds them over its devices, so a run on P hosts equals a
run on one host with as many devices up to float32 rounding of the sums (the per-client work is the
same, bit for bit).

Streaming (``stream_size``): the cohort stays on the host and goes to the device ``stream_size``
clients at a time (the last slice padded with masked copies, so one program serves every slice); the
model-sized sums are added on the device and the per-client rows come back to the host. The device
then holds one slice's inputs, not the cohort's: peak device memory is bounded by the slice, not by
C. ``auto`` is resolved by :func:`fedjax_dp.core.strategy.choose_strategy`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_dp.core import hosts

STRATEGIES = ("vmap", "chunked", "sequential", "loop")
CLIENT_AXIS = "clients"
# default: 1 GiB of extra copies of the shared inputs (module docstring)
MAX_REPLICATED_BYTES = 2**30
# device counts whose unspread run was logged: once a process, not once an engine
_WARNED_ONE_DEVICE: set = set()

ClientFn = Callable[[Any, Any], tuple[Any, Any]]


def _num_clients(clients) -> int:
    sizes = {x.shape[0] for x in jax.tree_util.tree_leaves(clients)}
    if len(sizes) != 1:
        raise ValueError(
            f"all client arrays need the same leading (client) axis; got sizes {sorted(sizes)}"
        )
    return sizes.pop()


def _zero_invalid(summed, valid):
    """Zero the contributions of padding clients (``where``, so a NaN there cannot leak)."""
    return jax.tree_util.tree_map(
        lambda x: jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - 1)), x, jnp.zeros_like(x)),
        summed,
    )


def _sum_clients(summed, valid):
    return jax.tree_util.tree_map(lambda x: jnp.sum(x, axis=0), _zero_invalid(summed, valid))


def _pad_clients(clients, valid, multiple: int):
    """Pads the client axis to a multiple by repeating the last client, marked invalid."""
    n = valid.shape[0]
    total = math.ceil(n / multiple) * multiple
    if total == n:
        return clients, valid
    idx = jnp.minimum(jnp.arange(total), n - 1)
    clients = jax.tree_util.tree_map(lambda x: x[idx], clients)
    valid = jnp.concatenate([valid, jnp.zeros(total - n, dtype=bool)])
    return clients, valid


def _vmap(client_fn, shared, clients, valid):
    summed, per_client = jax.vmap(client_fn, in_axes=(None, 0))(shared, clients)
    return _sum_clients(summed, valid), per_client


def _one_at_a_time(client_fn):
    """``client_fn`` lifted to groups of one client, without ``vmap`` (a different XLA program)."""

    def fn(shared, group):
        out = client_fn(shared, jax.tree_util.tree_map(lambda x: x[0], group))
        return jax.tree_util.tree_map(lambda x: x[None], out)

    return fn


def _scan(client_fn, shared, clients, valid, chunk_size: int | None):
    """``lax.scan`` over single clients (``chunk_size=None``) or over vmapped chunks of clients.

    Each step slices its chunk out of the cohort in place (no padded copy of the cohort's data: at
    10^4 clients that copy was as large as the data). When the cohort is not a multiple of the
    chunk, the last chunk is the cohort's last ``chunk`` clients; those already summed in the chunk
    before are masked out of the sum and their per-client rows dropped.
    """
    n = valid.shape[0]
    if chunk_size is None:
        fn, group = _one_at_a_time(client_fn), 1
    else:
        fn, group = jax.vmap(client_fn, in_axes=(None, 0)), min(chunk_size, n)
    steps, tail = -(-n // group), n % group
    take = lambda x, start: jax.lax.dynamic_slice_in_dim(x, start, group)  # noqa: E731
    summed_shape, _ = jax.eval_shape(
        fn, shared, jax.tree_util.tree_map(lambda x: take(x, 0), clients)
    )
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape[1:], s.dtype), summed_shape)

    def body(acc, index):
        start = jnp.minimum(index * group, n - group)
        fresh = start + jnp.arange(group) >= index * group  # False: summed by the previous chunk
        summed, per_client = fn(shared, jax.tree_util.tree_map(lambda x: take(x, start), clients))
        acc = jax.tree_util.tree_map(jnp.add, acc, _sum_clients(summed, take(valid, start) & fresh))
        return acc, per_client

    total, per_client = jax.lax.scan(body, zeros, jnp.arange(steps))

    # (steps, group, ...) -> (n, ...): every row of the full chunks, the fresh ones of the last
    def rows(x):
        if not tail:
            return x.reshape((n,) + x.shape[2:])
        return jnp.concatenate([x[:-1].reshape((-1,) + x.shape[2:]), x[-1, group - tail :]])

    return total, jax.tree_util.tree_map(rows, per_client)


def _traced_strategy(strategy: str, chunk_size: int | None):
    if strategy == "vmap":
        return _vmap
    if strategy == "chunked":
        return lambda f, s, c, v: _scan(f, s, c, v, chunk_size)
    if strategy == "sequential":
        return lambda f, s, c, v: _scan(f, s, c, v, None)
    raise ValueError(
        f"strategy {strategy!r} cannot be traced inside jit; traced strategies: vmap, chunked,"
        " sequential"
    )


@dataclasses.dataclass
class EngineRecord:
    """What a ``CohortEngine``'s calls observed, for the run's record (the engine itself stays
    frozen)."""

    ran_on_one_device: bool = False


@dataclasses.dataclass(frozen=True)
class CohortEngine:
    """Runs ``client_fn`` over cohorts with a fixed strategy; build once, call every round.

    Calling it returns ``(sum over clients of summed, stacked per_client)``. For the traced
    strategies the call is one jitted program; ``trace`` gives the same computation for use inside
    a caller's own ``jit``.
    """

    client_fn: ClientFn
    strategy: str = "vmap"
    chunk_size: int | None = None
    mesh: Mesh | None = None
    # the outputs of a client that raised (default: zeros, finite False)
    failed_fn: ClientFn | None = None
    # send the cohort to the device this many clients at a time (traced strategies)
    stream_size: int | None = None
    devices: tuple | None = None  # strategy 'loop': dispatch clients round-robin to these devices
    # spread (devices or mesh) only while the shared inputs' extra copies fit
    max_replicated_bytes: int = MAX_REPLICATED_BYTES
    # what calls observed (a fresh record per engine, not part of its identity): whether one ran
    # unspread
    observed: "EngineRecord" = dataclasses.field(
        default_factory=lambda: EngineRecord(), init=False, compare=False, repr=False
    )

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"unknown cohort strategy {self.strategy!r}; choose one of {STRATEGIES} (or 'auto'"
                " via choose_strategy)"
            )
        if self.strategy == "chunked" and (self.chunk_size is None or self.chunk_size < 1):
            raise ValueError(f"strategy 'chunked' needs chunk_size >= 1, got {self.chunk_size!r}")
        if self.mesh is not None and self.strategy == "loop":
            raise ValueError(
                "strategy 'loop' cannot be combined with a device mesh; use vmap, chunked or"
                " sequential"
            )
        if self.devices is not None and (self.strategy != "loop" or not self.devices):
            raise ValueError(
                "devices= spreads strategy 'loop' over devices (traced strategies take a mesh);"
                f" got strategy {self.strategy!r} with devices {self.devices!r}"
            )
        if self.stream_size is not None and self.stream_size < 1:
            raise ValueError(
                "stream_size must be >= 1 clients (None: the whole cohort at once), got"
                f" {self.stream_size!r}"
            )
        if self.mesh is not None and CLIENT_AXIS not in self.mesh.axis_names:
            raise ValueError(
                f"the mesh needs an axis named {CLIENT_AXIS!r}; it has {self.mesh.axis_names}"
            )

    @functools.cached_property
    def _jitted(self):
        return jax.jit(self.trace)

    @functools.cached_property
    def _one_device(self) -> "CohortEngine":
        """This engine without its spread (mesh or devices): what runs when spreading costs too much
        memory."""
        return dataclasses.replace(self, mesh=None, devices=None)

    @property
    def ran_on_one_device(self) -> bool:
        """Whether a call has run unspread for memory (``max_replicated_bytes``): a run records
        it."""
        return self.observed.ran_on_one_device

    def _spreads(self, shared) -> bool:
        """Whether to spread the cohort: only if one is configured and its extra copies of
        ``shared`` (one per device past the first) fit ``max_replicated_bytes``; a refusal is logged
        once a process (a run builds one engine per static upload configuration: per set of
        compression rates)."""
        count = (
            len(self.devices)
            if self.devices
            else self.mesh.devices.size
            if self.mesh is not None
            else 1
        )
        extra = (count - 1) * sum(
            getattr(x, "nbytes", 0) for x in jax.tree_util.tree_leaves(shared)
        )
        if extra <= self.max_replicated_bytes:
            return count > 1
        self.observed.ran_on_one_device = True
        if count not in _WARNED_ONE_DEVICE:
            _WARNED_ONE_DEVICE.add(count)
            logging.warning(
                "cohort engine: spreading over %d devices would copy the shared inputs %d more"
                " times (%.2f GB > max_replicated_bytes %.2f GB); running on one device",
                count,
                count - 1,
                extra / 2**30,
                self.max_replicated_bytes / 2**30,
            )
        return False

    @functools.cached_property
    def _client_jit(self):
        return jax.jit(self.client_fn)

    @functools.cached_property
    def _failed_jit(self):
        return jax.jit(self.failed_fn) if self.failed_fn is not None else None

    def trace(self, shared, clients, valid=None):
        """The traced computation (strategies vmap, chunked, sequential); ``valid`` masks padding
        clients out of the sum (default: every client counts)."""
        n = _num_clients(clients)
        valid = jnp.ones(n, dtype=bool) if valid is None else valid
        run = _traced_strategy(self.strategy, self.chunk_size)
        if self.mesh is None:
            return run(self.client_fn, shared, clients, valid)
        devices = self.mesh.shape[CLIENT_AXIS]
        clients, valid = _pad_clients(clients, valid, devices)

        def shard(shared, clients, valid):
            summed, per_client = run(self.client_fn, shared, clients, valid)
            return jax.lax.psum(summed, CLIENT_AXIS), per_client

        spec = PartitionSpec(CLIENT_AXIS)
        summed, per_client = jax.shard_map(
            shard,
            mesh=self.mesh,
            in_specs=(PartitionSpec(), spec, spec),
            out_specs=(PartitionSpec(), spec),
            check_vma=False,  # local training carries replicated params that become per-device
        )(shared, clients, valid)
        return summed, jax.tree_util.tree_map(lambda x: x[:n], per_client)

    @property
    def across_hosts(self) -> bool:
        """Whether the mesh spans several processes: each passes only its own rows (module
        docstring)."""
        return self.mesh is not None and self.mesh.is_multi_process

    def __call__(self, shared, clients):
        if self.across_hosts:
            return self._across_hosts(shared, clients)
        if (self.mesh is not None or self.devices) and not self._spreads(shared):
            return self._one_device(shared, clients)
        if self.strategy == "loop":
            return self._one_at_a_time_contained(shared, clients)
        if self.stream_size is not None and _num_clients(clients) > self.stream_size:
            return self._streamed(shared, clients)
        return self._contained(shared, clients)

    def _contained(
        self, shared, clients, valid=None, failures: list | None = None, offset: int = 0
    ):
        """The jitted program; if it fails at run time, every real client again in its own call."""
        try:  # block: a run-time error surfaces here, not later in the caller
            if self.mesh is None:
                return jax.block_until_ready(self._jitted(shared, clients, valid))
            outputs = self._jitted(*_onto_mesh(self.mesh, (shared, clients, valid)))
            return jax.block_until_ready(jax.device_put(outputs, self.mesh.devices.flat[0]))
        except jax.errors.JaxRuntimeError as error:  # at run time, not tracing: find the client
            logging.warning(
                "the cohort program failed at run time (%s); rerunning its clients one at a "
                "time to contain the failure",
                _first_line(error),
            )
        if valid is not None:  # a padded slice: its real clients only (padding is at the end)
            clients = jax.tree_util.tree_map(lambda x: x[: int(np.sum(valid))], clients)
        return self._one_at_a_time_contained(shared, clients, failures, offset)

    def _streamed(self, shared, clients):
        """The cohort in host-side slices of ``stream_size`` clients (module docstring,
        Streaming)."""
        n, size = _num_clients(clients), self.stream_size
        total, rows, failures = None, [], []
        for start in range(0, n, size):
            real = min(size, n - start)
            # the last slice repeats its last client
            index = np.minimum(np.arange(start, start + size), n - 1)
            part = jax.tree_util.tree_map(lambda x: x[index], clients)
            summed, per_client = self._contained(
                shared, part, np.arange(size) < real, failures, start
            )
            total = summed if total is None else _add(total, summed)
            rows.append(jax.tree_util.tree_map(lambda x: np.asarray(x)[:real], per_client))
        if len(failures) == n:  # as unstreamed: a fault of every client is the program's
            raise failures[0]
        return total, jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *rows)

    @functools.cached_property
    def _hosts_jitted(self):
        """``trace`` over host arrays: typed PRNG keys travel as their data
        (``hosts.key_data_tree``) and are wrapped again inside the program."""

        def run(spec, shared, clients, valid):
            shared, clients = (
                hosts.wrap_key_tree(spec[0], shared),
                hosts.wrap_key_tree(spec[1], clients),
            )
            return self.trace(shared, clients, valid)

        return jax.jit(run, static_argnums=0)

    def _across_hosts(self, shared, clients):
        """This process's rows with every other process's, in host-side slices of ``stream_size``
        rows per host where set; every process gets the sums and every row (module docstring,
        Several hosts)."""
        local = _num_clients(clients)
        size = min(self.stream_size or local, local)
        count = hosts.process_count()
        if size % len(self.mesh.local_devices):
            raise ValueError(
                f"engine.stream_clients={size}: each host's slice must be a multiple of its "
                f"{len(self.mesh.local_devices)} devices"
            )
        (shared_spec, shared), (clients_spec, clients) = (
            hosts.key_data_tree(shared),
            hosts.key_data_tree(clients),
        )
        replicated, by_rows = (
            NamedSharding(self.mesh, PartitionSpec()),
            NamedSharding(self.mesh, PartitionSpec(CLIENT_AXIS)),
        )
        shared = jax.tree_util.tree_map(
            lambda x: jax.make_array_from_process_local_data(replicated, x), shared
        )
        total, slices = None, []
        for start in range(0, local, size):
            # the last slice repeats its last row
            index = np.minimum(np.arange(start, start + size), local - 1)
            part = (
                jax.tree_util.tree_map(lambda x: x[index], clients),
                np.arange(start, start + size) < local,
            )
            part = jax.tree_util.tree_map(
                lambda x: jax.make_array_from_process_local_data(
                    by_rows, x, (size * count,) + x.shape[1:]
                ),
                part,
            )
            summed, per_client = jax.block_until_ready(
                self._hosts_jitted((shared_spec, clients_spec), shared, *part)
            )
            summed = hosts.local_copy(summed)
            total = summed if total is None else _add(total, summed)
            # every host's rows of this slice, host after host: (hosts, size, ...) -> this slice's
            # real rows
            slices.append(
                jax.tree_util.tree_map(
                    lambda x: x.reshape((count, size) + x.shape[1:])[:, : min(size, local - start)],
                    hosts.gather_rows(per_client),
                )
            )
        # (hosts, local, ...)
        rows = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=1), *slices)
        return total, jax.tree_util.tree_map(
            lambda x: x.reshape((count * local,) + x.shape[2:]), rows
        )

    def _one_at_a_time_contained(
        self, shared, clients, failures: list | None = None, offset: int = 0
    ):
        """Every client in its own call; a client that raises is dropped: it contributes zeros and
        its ``per_client['finite']`` is False, so algorithms count it and the loop logs its id. If
        every client raises, the fault is the program's, not a client's, and the first error is
        raised. A streamed slice passes the cohort's ``failures`` (its errors are added there; the
        caller decides) and ``offset``, the cohort position of its first client."""
        n = _num_clients(clients)
        total, rows, errors = None, [], [] if failures is None else failures
        devices = self.devices or (None,)
        shared_on = [shared if d is None else jax.device_put(shared, d) for d in devices]
        # (position, client, its shared, outputs or the error dispatching raised)
        in_flight = collections.deque()
        for i in range(n):
            d = i % len(devices)
            client = jax.tree_util.tree_map(lambda x: x[i], clients)
            client = client if devices[d] is None else jax.device_put(client, devices[d])
            try:  # dispatch only: the client runs while the previous ones are collected
                outputs = self._client_jit(shared_on[d], client)
            except Exception as error:  # noqa: BLE001  (collected below like a run-time failure)
                outputs = error
            in_flight.append((i, client, shared_on[d], outputs))
            # the oldest frees the next device
            while in_flight and (len(in_flight) == len(devices) or i == n - 1):
                summed, per_client = self._collect(*in_flight.popleft(), errors, offset, devices[0])
                total = summed if total is None else _add(total, summed)
                rows.append(per_client)
        if failures is None and len(errors) == n:
            raise errors[0]
        return total, jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *rows)

    def _collect(self, i, client, shared, outputs, errors: list, offset: int, first_device):
        """One dispatched client's outputs on ``first_device`` (None: where they are); a client that
        raised, at dispatch or at run time, is logged and replaced by the failed outputs."""
        try:
            if isinstance(outputs, Exception):
                raise outputs
            outputs = jax.block_until_ready(outputs)
        except Exception as error:  # noqa: BLE001  (contained, counted and logged; re-raised if all fail)
            errors.append(error)
            logging.warning(
                "client at cohort position %d raised %s: %s; its update is dropped",
                offset + i,
                type(error).__name__,
                _first_line(error),
            )
            outputs = (
                _failed_client_outputs(self.client_fn, shared, client)
                if self._failed_jit is None
                else self._failed_jit(shared, client)
            )
        return outputs if first_device is None else jax.device_put(outputs, first_device)


def _onto_mesh(mesh: Mesh, tree):
    """Arrays committed to other devices (a state restored onto one device, say) replicated over
    ``mesh``: jit refuses a mix of one-device and mesh arrays. Host (numpy) and uncommitted arrays
    are left to jit to place."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree_util.tree_map(
        lambda x: jax.device_put(x, replicated) if getattr(x, "committed", False) else x, tree
    )


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]


def _failed_client_outputs(client_fn, shared, client):
    """Zeros in the shape of ``client_fn``'s outputs, with ``per_client['finite']`` False
    (dropped)."""
    summed_shape, per_client_shape = jax.eval_shape(client_fn, shared, client)
    if not isinstance(per_client_shape, dict) or "finite" not in per_client_shape:
        raise TypeError(
            "fault containment needs the client function's per-client outputs to hold 'finite'"
        )
    zeros = lambda tree: jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), tree)  # noqa: E731
    return zeros(summed_shape), {**zeros(per_client_shape), "finite": jnp.zeros((), bool)}


_add = jax.jit(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b))


def client_mesh(num_devices: int | None = None) -> Mesh:
    """A one-axis mesh named ``clients`` over the first ``num_devices`` local devices (all by
    default); under several processes, over every process's devices (``num_devices`` must then be
    None or all of them)."""
    if hosts.distributed():
        if num_devices not in (None, jax.device_count()):
            raise ValueError(
                f"engine.num_devices={num_devices}: under {jax.process_count()} processes the"
                f" cohort is spread over all {jax.device_count()} devices (set 0)"
            )
        return Mesh(np.array(jax.devices()), (CLIENT_AXIS,))
    devices = jax.local_devices()
    if num_devices is not None:
        if not 1 <= num_devices <= len(devices):
            raise ValueError(f"num_devices={num_devices} but {len(devices)} local devices exist")
        devices = devices[:num_devices]
    return Mesh(np.array(devices), (CLIENT_AXIS,))
