"""ACID-c and ALID-c: every client holds c classes, with its own train and test data
(PFLDyn / CUAG-PFL experiments, ALGORITHMS.md §4).

* ``acid``: each client gets c distinct classes (class counts kept balanced across clients);
  every class's train examples are dealt without replacement to the clients that hold it, and the
  same for its test examples, so a client's test set has exactly its training classes.
* ``alid``: ACID, then each client applies its own random permutation of the label indices to
  both its train and its test labels (a label-skew task where a global model cannot fit everyone).
"""

from __future__ import annotations

import numpy as np


def assign_classes(
    num_clients: int, num_classes: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """c distinct classes per client; each class is held by floor or ceil of N*c/C clients."""
    if not 1 <= classes_per_client <= num_classes:
        raise ValueError(
            f"classes_per_client={classes_per_client} must lie in [1, {num_classes}] (the number of"
            " classes)"
        )
    counts = np.zeros(num_classes, dtype=int)
    out = []
    for _ in range(num_clients):
        # least-held classes first, ties broken at random
        order = np.lexsort((rng.random(num_classes), counts))
        chosen = np.sort(order[:classes_per_client])
        counts[chosen] += 1
        out.append(chosen)
    return out


def deal_by_class(
    labels: np.ndarray,
    class_sets: list[np.ndarray],
    rng: np.random.Generator,
    max_per_client: int = 0,
) -> list[np.ndarray]:
    """Deals every class's examples without replacement, evenly, to the clients holding it."""
    parts = [[] for _ in class_sets]
    for c in np.unique(labels):
        holders = [k for k, classes in enumerate(class_sets) if c in classes]
        if not holders:
            continue
        pieces = np.array_split(rng.permutation(np.flatnonzero(labels == c)), len(holders))
        for k, piece in zip(holders, pieces):
            parts[k].append(piece)
    out = [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]
    if max_per_client > 0:
        out = [np.sort(rng.permutation(p)[:max_per_client]) for p in out]
    return out


def acid(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    num_classes: int,
    rng: np.random.Generator,
    max_train_per_client: int = 0,
    max_test_per_client: int = 0,
):
    """Returns ``(train_parts, test_parts, class_sets)``; test indices index the test split."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    class_sets = assign_classes(num_clients, num_classes, classes_per_client, rng)
    train = deal_by_class(train_labels, class_sets, rng, max_train_per_client)
    test = deal_by_class(test_labels, class_sets, rng, max_test_per_client)
    starved = [k for k, p in enumerate(train) if len(p) == 0]
    if starved:
        raise ValueError(
            f"acid: clients {starved[:10]} got no training examples; lower num_clients or raise "
            "classes_per_client (N*c/C clients share each class)"
        )
    return train, test, class_sets


def label_permutations(num_clients: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """``(num_clients, num_classes)``: row k is client k's bijection old label -> new label."""
    return np.stack([rng.permutation(num_classes) for _ in range(num_clients)])


def apply_label_maps(
    y: np.ndarray, client_parts: list[list[np.ndarray]], maps: np.ndarray
) -> np.ndarray:
    """A relabelled copy of ``y``: client k's examples (train and test parts alike) get
    ``maps[k][y]``. Examples must belong to at most one client (true for acid), else the maps would
    collide."""
    out = y.copy()
    seen = np.zeros(len(y), dtype=bool)
    for k, parts in enumerate(client_parts):
        for idx in parts:
            if seen[idx].any():
                raise ValueError(
                    f"example {int(idx[seen[idx]][0])} belongs to two clients; cannot relabel per"
                    " client"
                )
            seen[idx] = True
            out[idx] = maps[k][y[idx]]
    return out
