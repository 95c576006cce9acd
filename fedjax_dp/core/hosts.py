"""Several hosts, one program: the few facts and collectives the cohort engine and the training loop
need under JAX's multi-controller runtime (``jax.distributed``).

Every process runs the same Python program over the same seed, so every host-side decision (which
clients take part, the privacy ledger, the server step, every key) is made identically on every
host; nothing here draws randomness. What differs is the data: a round's cohort of ``n`` slots is
cut into ``process_count()`` equal, contiguous ranges of rows (``host_rows``), each host packs and
trains only its own, and the cohort engine adds the clients' sums across hosts inside one program.
The per-client rows (small scalars; an algorithm's new per-client states) come back to every host
(``gather_rows``). Results, plots and checkpoints are written by process 0 alone (``is_primary``); a
host-side step that may fail on process 0 only (reading a checkpoint, preparing the workdir) runs
there and its outcome, a value or the error, is given to every process (``on_primary``), so all of
them stop with the same message instead of waiting for each other.

In one process every function here is the identity (or its single-host meaning): no collective runs.
"""

from __future__ import annotations

import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np


def distributed() -> bool:
    """Whether this program runs as several JAX processes (``jax.distributed.initialize`` was called
    with more than one). Starts no backend where it was not called (a JAX setting may still be
    changed)."""
    return jax.distributed.is_initialized() and jax.process_count() > 1


def process_count() -> int:
    return jax.process_count() if distributed() else 1


def is_primary() -> bool:
    """Whether this process writes the run's results (process 0)."""
    return not distributed() or jax.process_index() == 0


def host_rows(num_slots: int) -> slice:
    """This process's contiguous share of a cohort of ``num_slots`` slots (a multiple of
    ``process_count()``): the rows whose clients it packs and trains. The rows go to its devices in
    order, as ``jax.devices()`` lists them."""
    count, index = process_count(), jax.process_index() if distributed() else 0
    if num_slots % count:
        raise ValueError(
            f"a cohort of {num_slots} slots cannot be split evenly over {count} processes"
        )
    share = num_slots // count
    return slice(index * share, (index + 1) * share)


def padded_slots(num_slots: int, multiple: int) -> int:
    """``num_slots`` rounded up to a multiple of ``multiple`` (the global device count): the extra
    slots are empty clients, which train no step and add exactly zero."""
    return -(-num_slots // multiple) * multiple


def gather_rows(tree):
    """A pytree of global arrays sharded by rows (a cohort's per-client outputs) as numpy arrays
    holding every row, on every process."""
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def local_copy(tree, device=None):
    """A pytree of fully replicated global arrays as arrays on this process's first device (or
    ``device``)."""
    device = device or jax.local_devices()[0]
    return jax.tree_util.tree_map(lambda x: jax.device_put(x.addressable_data(0), device), tree)


def key_data_tree(tree):
    """``(spec, tree of numpy arrays)``: typed PRNG keys replaced by their data (collectives and
    ``make_array_from_process_local_data`` take plain arrays), ``spec`` naming each leaf's key
    implementation (None: not a key) for ``wrap_key_tree``."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    is_key = [jnp.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key) for x in leaves]
    spec = tuple(str(jax.random.key_impl(x)) if k else None for x, k in zip(leaves, is_key))
    data = [np.asarray(jax.random.key_data(x) if k else x) for x, k in zip(leaves, is_key)]
    return spec, jax.tree_util.tree_unflatten(treedef, data)


def wrap_key_tree(spec, tree):
    """``key_data_tree``'s inverse (inside a program too)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return jax.tree_util.tree_unflatten(
        treedef,
        [
            x if impl is None else jax.random.wrap_key_data(x, impl=impl)
            for x, impl in zip(leaves, spec)
        ],
    )


def broadcast_tree(tree):
    """Process 0's values of ``tree`` on every process as numpy arrays (the others pass a tree of
    the same shapes and dtypes; typed PRNG keys come back as keys)."""
    if not distributed():
        return tree
    from jax.experimental import multihost_utils

    spec, data = key_data_tree(tree)
    data = jax.tree_util.tree_map(np.asarray, multihost_utils.broadcast_one_to_all(data))
    return wrap_key_tree(spec, data)


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is set on any process (a signal that reached one host stops them all after
    the round)."""
    if not distributed():
        return bool(flag)
    return bool(np.any(gather_rows(np.array([bool(flag)]))))


def broadcast_json(value=None):
    """Process 0's JSON-serialisable ``value`` on every process (the others' ``value`` is
    ignored)."""
    if not distributed():
        return value
    payload = (
        np.frombuffer(json.dumps(value).encode(), np.uint8)
        if is_primary()
        else np.zeros(0, np.uint8)
    )
    size = int(broadcast_tree(np.array([payload.size], np.int64))[0])
    buffer = payload if is_primary() else np.zeros(size, np.uint8)
    return json.loads(bytes(broadcast_tree(buffer)).decode())


class PrimaryError(RuntimeError):
    """An error raised on process 0 by a step it ran for every process (``on_primary``), re-raised
    on the others."""


def on_primary(function, *args, share: bool = False, **kwargs):
    """``function(*args, **kwargs)`` run on process 0 only. Process 0 gets its result; the others
    get it too with ``share`` (it must then be JSON-serialisable), else None. An error it raised is
    raised on every process (the same class where that class takes one message, so the command's
    exit status is the same everywhere; ``PrimaryError`` otherwise). In one process: the call
    itself."""
    if not distributed():
        return function(*args, **kwargs)
    if not is_primary():
        outcome = broadcast_json()
        if "error" in outcome:
            raise _same_error(outcome)
        return outcome.get("value")
    try:
        value = function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001  (given to every process, then raised on each)
        broadcast_json(
            {
                "error": type(error).__name__,
                "module": type(error).__module__,
                "message": str(
                    error.args[0] if isinstance(error, KeyError) and error.args else error
                ),
            }
        )
        raise
    broadcast_json({"value": value} if share else {})
    return value


def _same_error(outcome: dict) -> Exception:
    """The error process 0 raised, rebuilt from its class and message where the class takes one
    message."""
    try:
        kind = getattr(importlib.import_module(outcome["module"]), outcome["error"])
        if isinstance(kind, type) and issubclass(kind, Exception):
            return kind(outcome["message"])
    except Exception:  # noqa: BLE001  (an error class that cannot be rebuilt from a message)
        pass
    return PrimaryError(f"process 0 raised {outcome['error']}: {outcome['message']}")


def shared_entropy() -> int:
    """128 bits of OS entropy drawn on process 0 and given to every process (``privacy.secure_rng``
    under several
    processes: the hosts' generators must agree, or they would sample and noise differently)."""
    entropy = int(np.random.SeedSequence().entropy) if is_primary() else 0
    words = np.array([(entropy >> (32 * k)) & 0xFFFFFFFF for k in range(4)], np.uint32)
    words = broadcast_tree(words)
    return sum(int(w) << (32 * k) for k, w in enumerate(words))
