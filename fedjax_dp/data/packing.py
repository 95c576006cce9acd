"""Packing a cohort into padded arrays for the cohort engine.

Each client's examples are shuffled (per round), repeated for E epochs and cut into batches of B;
the last batch of an epoch may be partial (as in an unpadded loop). All clients are padded to the
largest step count of the cohort; ``mask`` marks real examples, so local training treats padding
as absent (see ``core.local_training``).

``rows`` (a slice of the slots; several hosts, ``core.hosts.host_rows``): every client's batches are
drawn as always, in the same order from the same generator, but only those rows' examples are
gathered into ``batches``; the index arrays (``mask``, ``num_examples``, ``example_index``) keep
every slot.
"""

from __future__ import annotations

import math

import numpy as np


def _gathered(x, y, gather, rows: slice | None) -> dict:
    """The examples at ``gather`` (of ``rows`` only, where given)."""
    gather = gather if rows is None else gather[rows]
    return {"x": x[gather], "y": y[gather].astype(np.int32)}


def num_steps(num_examples: int, batch_size: int, epochs: int) -> int:
    return epochs * math.ceil(num_examples / batch_size)


def pack_cohort(
    x: np.ndarray,
    y: np.ndarray,
    client_indices: list[np.ndarray],
    batch_size: int,
    epochs: int,
    rng: np.random.Generator,
    max_steps: int | None = None,
    num_slots: int | None = None,
    rows: slice | None = None,
) -> dict:
    """Returns ``{'batches': {'x': (C,S,B,...), 'y': (C,S,B)}, 'mask': (C,S,B), 'num_examples':
    (C,), 'example_index': (C,S,B)}`` (``example_index`` says which example fills each slot, -1 for
    padding).

    ``max_steps`` (optional) pads to a fixed step count so every round reuses one compiled program;
    ``num_slots`` (optional) appends empty clients (no examples, all-false mask, ``num_examples`` 0)
    up to a fixed cohort size, so variable Poisson cohorts share a few compiled programs. An empty
    slot trains no step, so its update is exactly zero.
    """
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    sizes = [len(i) for i in client_indices]
    if not sizes and not num_slots:
        raise ValueError("cannot pack an empty cohort")
    if sizes and min(sizes) == 0:
        raise ValueError(
            "cannot pack a cohort with clients that hold no examples (positions"
            f" {[k for k, s in enumerate(sizes) if s == 0]})"
        )
    steps = max([num_steps(s, batch_size, epochs) for s in sizes] + [1])
    if max_steps is not None:
        if max_steps < steps:
            raise ValueError(
                f"max_steps={max_steps} is smaller than the {steps} steps this cohort needs"
            )
        steps = max_steps
    n = len(client_indices)
    if num_slots is not None:
        if num_slots < n:
            raise ValueError(f"num_slots={num_slots} is smaller than the cohort of {n} clients")
        sizes = sizes + [0] * (num_slots - n)
        n = num_slots
    gather = np.zeros((n, steps, batch_size), dtype=np.int64)
    mask = np.zeros((n, steps, batch_size), dtype=bool)
    for c, idx in enumerate(client_indices):
        step = 0
        for _ in range(epochs):
            order = rng.permutation(idx)
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                gather[c, step, : len(chunk)] = chunk
                mask[c, step, : len(chunk)] = True
                step += 1
    return {
        "batches": _gathered(x, y, gather, rows),
        "mask": mask,
        "num_examples": np.array(sizes, dtype=np.int32),
        "example_index": np.where(mask, gather, -1),
    }


def pack_uga_cohort(
    x: np.ndarray,
    y: np.ndarray,
    client_indices: list[np.ndarray],
    batch_size: int,
    epochs: int,
    rng: np.random.Generator,
    max_steps: int | None = None,
    num_slots: int | None = None,
    eval_batch_size: int | None = None,
    max_eval_steps: int | None = None,
    rows: slice | None = None,
) -> dict:
    """A cohort for UGA (seed 002 §3.1): E-1 epochs of keep-trace batches as ``batches``/``mask``,
    and the whole local data once as ``eval_batches``/``eval_mask`` (batches of ``eval_batch_size``,
    default ``batch_size``) for the last epoch's gradient evaluation L(h_k(w_t); D_k)."""
    if epochs < 1:
        raise ValueError(f"UGA needs E >= 1 local epochs, got {epochs}")
    cohort = pack_cohort(
        x, y, client_indices, batch_size, epochs - 1, rng, max_steps, num_slots, rows
    )
    whole = pack_cohort(
        x, y, client_indices, eval_batch_size or batch_size, 1, rng, max_eval_steps, num_slots, rows
    )
    return {**cohort, "eval_batches": whole["batches"], "eval_mask": whole["mask"]}


def _checked_slots(client_indices, batch_size: int, num_slots: int | None) -> int:
    """The cohort's slot count, after refusing clients smaller than a step's batch and too few
    slots."""
    small = [k for k, idx in enumerate(client_indices) if len(idx) < batch_size]
    if small:
        raise ValueError(
            f"batch size B={batch_size} is larger than the data of clients at cohort positions"
            f" {small} ({[len(client_indices[k]) for k in small]} examples)"
        )
    n = len(client_indices) if num_slots is None else num_slots
    if n < len(client_indices):
        raise ValueError(
            f"num_slots={num_slots} is smaller than the cohort of {len(client_indices)} clients"
        )
    return n


def pack_sampled_cohort(
    x: np.ndarray,
    y: np.ndarray,
    client_indices: list[np.ndarray],
    batch_size: int,
    steps: int,
    rng: np.random.Generator,
    num_slots: int | None = None,
    rows: slice | None = None,
) -> dict:
    """A cohort for example-level DP with per-step sampling: each of ``steps`` local steps draws its
    batch of exactly ``batch_size`` examples uniformly without replacement from the client's data,
    independently of the other steps (the sampling ``SampledWithoutReplacementDpEvent(n_k, B)``
    accounts; a shuffled epoch partition would not match it). Same layout as ``pack_cohort``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    n = _checked_slots(client_indices, batch_size, num_slots)
    gather = np.zeros((n, steps, batch_size), dtype=np.int64)
    mask = np.zeros((n, steps, batch_size), dtype=bool)
    for c, idx in enumerate(client_indices):
        for step in range(steps):
            gather[c, step] = rng.choice(idx, batch_size, replace=False)
        mask[c] = True
    sizes = [len(i) for i in client_indices] + [0] * (n - len(client_indices))
    return {
        "batches": _gathered(x, y, gather, rows),
        "mask": mask,
        "num_examples": np.array(sizes, dtype=np.int32),
        "example_index": np.where(mask, gather, -1),
    }


def pack_poisson_cohort(
    x: np.ndarray,
    y: np.ndarray,
    client_indices: list[np.ndarray],
    batch_size: int,
    steps: int,
    cap: int,
    rng: np.random.Generator,
    num_slots: int | None = None,
    rows: slice | None = None,
) -> dict:
    """A cohort of Poisson-sampled local steps: in each of ``steps`` steps every example of a client
    is in the batch independently with probability ``batch_size / n_k`` (expected size B, the
    sampling ``PoissonSampledDpEvent`` accounts); batches are padded to ``cap`` slots and one larger
    than ``cap`` is cut to ``cap`` examples at random
    (``privacy.accounting.poisson_truncation.batch_cap`` bounds how often and charges it to delta).
    Same layout as ``pack_cohort``; a step may be empty."""
    if steps < 1 or cap < 1:
        raise ValueError(f"steps and cap must be >= 1, got steps={steps}, cap={cap}")
    n = _checked_slots(client_indices, batch_size, num_slots)
    gather = np.zeros((n, steps, cap), dtype=np.int64)
    mask = np.zeros((n, steps, cap), dtype=bool)
    for c, idx in enumerate(client_indices):
        idx = np.asarray(idx)
        for step in range(steps):
            chosen = idx[rng.random(len(idx)) < batch_size / len(idx)]
            if len(chosen) > cap:
                chosen = rng.choice(chosen, cap, replace=False)
            gather[c, step, : len(chosen)] = chosen
            mask[c, step, : len(chosen)] = True
    sizes = [len(i) for i in client_indices] + [0] * (n - len(client_indices))
    return {
        "batches": _gathered(x, y, gather, rows),
        "mask": mask,
        "num_examples": np.array(sizes, dtype=np.int32),
        "example_index": np.where(mask, gather, -1),
    }
