"""Small server-held datasets: FedMeta's D_meta and FedShare's shared set (ALGORITHMS.md §2).

D_meta is about 1 % of the data. The controllability experiment draws it from ``num_writers``
writers of whom exactly ``overlap * num_writers`` are training clients and the rest held-out
writers (never sampled for training), with an equal example quota per writer.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.data.natural_clients import GroupedSplit


@dataclasses.dataclass(frozen=True)
class ServerSet:
    """Server-held examples. ``source_clients`` names the writers they came from (empty for IID)."""

    x: np.ndarray
    y: np.ndarray
    source_clients: tuple[str, ...] = ()
    overlapping_clients: tuple[str, ...] = ()

    @property
    def writer_overlap(self) -> float:
        return (
            len(self.overlapping_clients) / len(self.source_clients)
            if self.source_clients
            else float("nan")
        )


def default_size(num_train_examples: int, fraction: float = 0.01) -> int:
    if not 0 < fraction <= 1:
        raise ValueError(f"server set fraction must lie in (0, 1], got {fraction}")
    return max(1, int(round(fraction * num_train_examples)))


def iid_server_set(x: np.ndarray, y: np.ndarray, size: int, rng: np.random.Generator) -> ServerSet:
    """``size`` examples drawn uniformly without replacement."""
    if not 1 <= size <= len(y):
        raise ValueError(f"server set size {size} must lie in [1, {len(y)}]")
    idx = np.sort(rng.choice(len(y), size, replace=False))
    return ServerSet(x[idx], y[idx])


def _quota_draw(pools: list[np.ndarray], size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Equal quotas per pool; what a small pool cannot give is redistributed to the others."""
    take = np.zeros(len(pools), dtype=int)
    caps = np.array([len(p) for p in pools])
    if caps.sum() < size:
        raise ValueError(
            f"the chosen writers hold {caps.sum()} examples, fewer than the {size} requested"
        )
    remaining = size
    while remaining:
        open_ = np.flatnonzero(take < caps)
        share = np.array_split(np.arange(remaining), len(open_))
        for k, s in zip(rng.permutation(open_), share):
            take[k] += min(len(s), caps[k] - take[k])
        remaining = size - take.sum()
    return [rng.choice(p, t, replace=False) for p, t in zip(pools, take)]


def writer_server_set(
    train: GroupedSplit,
    test: GroupedSplit,
    training_clients: list[str],
    size: int,
    overlap: float,
    rng: np.random.Generator,
    num_writers: int = 20,
) -> ServerSet:
    """D_meta from ``num_writers`` writers, an exact fraction ``overlap`` of them training clients.

    A training writer contributes examples of its training split (the data the server would share
    with that client); a held-out writer contributes any of its examples.
    """
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap must lie in [0, 1], got {overlap}")
    n_overlap = overlap * num_writers
    if abs(n_overlap - round(n_overlap)) > 1e-9:
        raise ValueError(
            f"overlap={overlap} of num_writers={num_writers} writers is not a whole number of"
            " writers"
        )
    n_overlap = int(round(n_overlap))
    training = sorted(set(training_clients))
    heldout = sorted(
        (set(train.client_ids().tolist()) | set(test.client_ids().tolist())) - set(training)
    )
    if n_overlap > len(training) or num_writers - n_overlap > len(heldout):
        raise ValueError(
            f"overlap={overlap} with num_writers={num_writers} needs {n_overlap} training and"
            f" {num_writers - n_overlap} held-out writers; there are {len(training)} and"
            f" {len(heldout)}"
        )
    inside = rng.choice(np.array(training), n_overlap, replace=False).tolist() if n_overlap else []
    outside = (
        rng.choice(np.array(heldout), num_writers - n_overlap, replace=False).tolist()
        if num_writers > n_overlap
        else []
    )
    train_idx, test_idx = train.indices_by_client(), test.indices_by_client()
    none = np.zeros(0, dtype=np.int64)
    # one pool per writer, over the concatenation [train examples, test examples]
    pools = [train_idx[w] for w in inside]
    pools += [
        np.concatenate([train_idx.get(w, none), test_idx.get(w, none) + len(train.y)])
        for w in outside
    ]
    drawn = np.sort(np.concatenate(_quota_draw(pools, size, rng)))
    x, y = np.concatenate([train.x, test.x]), np.concatenate([train.y, test.y])
    return ServerSet(x[drawn], y[drawn], tuple(inside + outside), tuple(inside))
