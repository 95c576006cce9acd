"""Partitioners: split example indices (by label) into per-client index arrays.

* ``iid``: shuffle, deal into equal parts.
* ``shards``: McMahan et al. 2017 / Geyer et al. 2017 non-IID split: sort by label, cut into
  ``num_clients * shards_per_client`` equal shards, give each client ``shards_per_client`` random
  ones.
* ``dirichlet``: for every class, split its examples across clients in proportions drawn from
  Dirichlet(alpha) (Hsu et al. 2019); small alpha = skewed clients.

Every partitioner assigns each example to at most one client.
"""

from __future__ import annotations

import numpy as np


def _check_clients(num_clients: int, num_examples: int):
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > num_examples:
        raise ValueError(f"num_clients={num_clients} exceeds the {num_examples} examples available")


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Equal-size random parts (sizes differ by at most one)."""
    _check_clients(num_clients, len(labels))
    return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


def shards(
    labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Sort by label, cut into equal shards, ``shards_per_client`` random shards per client (McMahan
    et al. 2017).

    >>> labels = np.repeat(np.arange(10), 100)
    >>> parts = shards(labels, num_clients=50, shards_per_client=2, rng=np.random.default_rng(0))
    >>> len(parts), max(len(np.unique(labels[p])) for p in parts)
    (50, 2)
    """
    if shards_per_client < 1:
        raise ValueError(f"shards_per_client must be >= 1, got {shards_per_client}")
    num_shards = num_clients * shards_per_client
    _check_clients(num_clients, len(labels))
    if num_shards > len(labels):
        raise ValueError(
            f"num_clients x shards_per_client = {num_clients} x {shards_per_client} = {num_shards}"
            f" shards exceed the {len(labels)} examples available"
        )
    order = np.argsort(labels, kind="stable")
    shard_list = np.array_split(order, num_shards)
    assignment = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([shard_list[s] for s in row])) for row in assignment]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_examples: int = 1,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Per-class Dirichlet(alpha) proportions (Hsu et al. 2019); redraws until every client has
    ``min_examples``.

    >>> labels = np.repeat(np.arange(10), 100)
    >>> parts = dirichlet(labels, num_clients=20, alpha=0.1, rng=np.random.default_rng(0))
    >>> sum(map(len, parts)), all(len(p) >= 1 for p in parts)
    (1000, True)
    """
    if not alpha > 0:
        raise ValueError(f"dirichlet alpha must be > 0, got {alpha}")
    _check_clients(num_clients, len(labels))
    for _ in range(max_tries):
        parts = [[] for _ in range(num_clients)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, alpha))) * len(idx)).astype(int)[
                :-1
            ]
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
        parts = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in parts) >= min_examples:
            return parts
    raise ValueError(
        f"dirichlet(alpha={alpha}) left a client with fewer than {min_examples} examples in"
        f" {max_tries} draws; raise alpha or lower num_clients"
    )


def split_train_test(parts: list[np.ndarray], test_fraction: float, rng: np.random.Generator):
    """Splits every client's indices into local train and test parts (each client keeps >= 1
    train)."""
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must lie in [0, 1), got {test_fraction}")
    train, test = [], []
    for idx in parts:
        idx = rng.permutation(idx)
        n_test = min(int(round(test_fraction * len(idx))), len(idx) - 1)
        test.append(np.sort(idx[:n_test]))
        train.append(np.sort(idx[n_test:]))
    return train, test


def iid_split(num_train: int, num_test: int, num_clients: int, rng: np.random.Generator):
    """The UGA paper's CIFAR-10 setting: the train split and the test split are each dealt IID into
    ``num_clients`` equal parts, so every client has local train and local test data."""
    _check_clients(num_clients, min(num_train, num_test))
    deal = lambda n: [np.sort(p) for p in np.array_split(rng.permutation(n), num_clients)]  # noqa: E731
    return deal(num_train), deal(num_test)
