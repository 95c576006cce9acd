"""An in-memory federated dataset: shared example arrays plus per-client index lists."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class FederatedDataset:
    """Examples ``x``/``y`` with per-client train and test indices into them.

    Attributes:
      x: ``(N, *example_shape)`` float32 inputs.
      y: ``(N,)`` int32 labels, or ``(N, T)`` per-token targets for sequence data (Shakespeare).
      client_train: one index array per client (its local training data).
      client_test: one index array per client (its local test data; may be empty arrays).
      central_test: indices of the server's global test set.
      num_classes: number of label classes.
      name: a label for logs.
      metadata: what a builder knows beyond the arrays: natural client ids, per-client label maps
        (ALID), vocabulary facts; never read by training.
    """

    x: np.ndarray
    y: np.ndarray
    client_train: tuple[np.ndarray, ...]
    client_test: tuple[np.ndarray, ...]
    central_test: np.ndarray
    num_classes: int
    name: str = "dataset"
    metadata: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        validate(self)

    @property
    def num_clients(self) -> int:
        return len(self.client_train)

    @property
    def example_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def train_sizes(self) -> np.ndarray:
        return np.array([len(i) for i in self.client_train])


def validate(ds: FederatedDataset) -> None:
    """Raises ``ValueError`` naming the problem when the dataset is inconsistent."""
    if ds.x.shape[0] != ds.y.shape[0]:
        raise ValueError(f"x has {ds.x.shape[0]} examples but y has {ds.y.shape[0]}")
    if ds.y.ndim not in (1, 2):
        raise ValueError(f"labels must be (N,) or (N, T) per-token targets, got shape {ds.y.shape}")
    if not np.all(np.isfinite(ds.x)):
        bad = int(np.flatnonzero((~np.isfinite(ds.x.reshape(ds.x.shape[0], -1))).any(axis=1))[0])
        raise ValueError(f"x contains NaN or Inf (first at example {bad})")
    if len(ds.y) and (ds.y.min() < 0 or ds.y.max() >= ds.num_classes):
        raise ValueError(
            f"labels must lie in [0, {ds.num_classes}); found range [{ds.y.min()}, {ds.y.max()}]"
        )
    if len(ds.client_test) != len(ds.client_train):
        raise ValueError(
            f"{len(ds.client_train)} clients have train data but {len(ds.client_test)} have test"
            " lists"
        )
    empty = [k for k, idx in enumerate(ds.client_train) if len(idx) == 0]
    if empty:
        raise ValueError(
            f"clients {empty[:10]} have no training examples; drop them or change the partition"
        )
    n = ds.x.shape[0]
    for name, lists in (("client_train", ds.client_train), ("client_test", ds.client_test)):
        for k, idx in enumerate(lists):
            if len(idx) and (idx.min() < 0 or idx.max() >= n):
                raise ValueError(f"{name}[{k}] indexes outside [0, {n})")
