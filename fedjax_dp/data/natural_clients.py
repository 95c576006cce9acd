"""Natural partitions: one client per writer (FEMNIST) or per speaking role (Shakespeare).

The loaders return each split as a ``GroupedSplit`` (examples plus the natural client id of every
example); ``natural_partition`` selects ``num_clients`` of those ids with a seeded generator and
gives every selected client its own train examples and its own test examples.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.data.federated_dataset import FederatedDataset


@dataclasses.dataclass(frozen=True)
class GroupedSplit:
    """Examples ``x``/``y`` of one split and ``client[i]``, the natural client of example i."""

    x: np.ndarray
    y: np.ndarray
    client: np.ndarray

    def __post_init__(self):
        if not len(self.x) == len(self.y) == len(self.client):
            raise ValueError(
                f"x, y and client ids differ in length: {len(self.x)}, {len(self.y)},"
                f" {len(self.client)}"
            )

    def client_ids(self) -> np.ndarray:
        return np.unique(self.client)

    def indices_by_client(self) -> dict[str, np.ndarray]:
        order = np.argsort(self.client, kind="stable")
        names, starts = np.unique(self.client[order], return_index=True)
        return dict(zip(names.tolist(), np.split(order, starts[1:])))


def select_clients(
    train: GroupedSplit,
    test: GroupedSplit,
    num_clients: int,
    rng: np.random.Generator,
    require_test: bool = True,
    kind: str = "client",
    min_train: int = 0,
) -> list[str]:
    """``num_clients`` ids (all eligible ones when 0) with train data (at least ``min_train``
    examples, LEAF's minimum-samples filter), and test data if required."""
    names, counts = np.unique(train.client, return_counts=True)
    eligible = set(names[counts >= max(1, min_train)].tolist())
    if require_test:
        eligible &= set(test.client_ids().tolist())
    eligible = sorted(eligible)
    if num_clients < 0 or num_clients > len(eligible):
        raise ValueError(
            f"num_clients={num_clients} but only {len(eligible)} {kind}s have training data"
            + (f" (at least {min_train} examples)" if min_train > 1 else "")
            + (" and test data" if require_test else "")
            + " (0 selects all of them)"
        )
    if num_clients == 0:
        return eligible
    return sorted(rng.choice(np.array(eligible), num_clients, replace=False).tolist())


def natural_partition(
    train: GroupedSplit,
    test: GroupedSplit,
    num_clients: int,
    num_classes: int,
    rng: np.random.Generator,
    require_test: bool = True,
    name: str = "natural",
    kind: str = "client",
    metadata: dict | None = None,
    min_train: int = 0,
) -> FederatedDataset:
    """A ``FederatedDataset`` of the selected natural clients. The central test set is the union of
    the selected clients' test examples (the LEAF/TFF convention)."""
    chosen = select_clients(train, test, num_clients, rng, require_test, kind, min_train)
    train_idx, test_idx = train.indices_by_client(), test.indices_by_client()
    offset = len(train.x)
    empty = np.zeros(0, dtype=np.int64)
    client_train = tuple(train_idx[c] for c in chosen)
    client_test = tuple(test_idx.get(c, empty) + offset for c in chosen)
    central = np.sort(np.concatenate(client_test)) if client_test else empty
    meta = {"client_ids": tuple(chosen), "client_kind": kind, **(metadata or {})}
    return FederatedDataset(
        np.concatenate([train.x, test.x]),
        np.concatenate([train.y, test.y]),
        client_train,
        client_test,
        central,
        num_classes,
        name=name,
        metadata=meta,
    )
