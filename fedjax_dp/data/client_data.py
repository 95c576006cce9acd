"""Your own federated data: a mapping from client id to arrays, checked, as a ``FederatedDataset``.

    clients = {
        "alice": (x_alice, y_alice),                                  # training data only
        "bob": {"train": (x_bob, y_bob), "test": (x_bob_t, y_bob_t)}, # with local test data
    }
    fedjax_dp.register_data("my_clients", clients)   # data.source="my_clients"

A client's arrays may also be ``{"x": ..., "y": ...}``. Every client is checked before anything
trains, and a problem is refused in one line naming the client id: no training example, x and y of
different lengths, a NaN or Inf input, a negative or non-integer label, a label outside the stated
class count, examples of another shape than the other clients'. Where no client has test data each
holds out ``data.test_fraction`` of its examples (seeded by ``seed``); the central test set is the
union of the clients' test data (the LEAF / TFF convention). The privacy unit is the client id as
given: every example under one id is one client's, protected together.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedjax_dp.data.federated_dataset import FederatedDataset
from fedjax_dp.data.partition import split_train_test


def check_clients(clients, num_classes: int | None = None) -> list[tuple]:
    """``[(id, (x, y), (x_test, y_test) or None), ...]`` of ``clients`` (module docstring), as
    float32 inputs and int32 labels; raises ``ValueError`` in one line naming the first client id
    (and example) that does not fit."""
    if not isinstance(clients, Mapping) or not clients:
        raise ValueError(
            "federated data must be a non-empty mapping from client id to (x, y) arrays (or"
            f" {{'train': (x, y), 'test': (x, y)}}), got {_kind(clients)}"
        )
    out, shape = [], None
    for client, value in clients.items():
        train, test = _parts(client, value)
        train = _arrays(client, "train", *train, num_classes)
        test = None if test is None else _arrays(client, "test", *test, num_classes)
        if len(train[0]) == 0:
            raise ValueError(f"client {client!r} has no training examples; drop it or give it data")
        for part, arrays in (("train", train), ("test", test)):
            if arrays is None or not len(arrays[0]):
                continue
            if shape is None:
                shape = (client, arrays[0].shape[1:], arrays[1].shape[1:])
            elif (arrays[0].shape[1:], arrays[1].shape[1:]) != shape[1:]:
                raise ValueError(
                    f"client {client!r} ({part}): examples of shape {arrays[0].shape[1:]} with"
                    f" labels {arrays[1].shape[1:]}, but client {shape[0]!r} has {shape[1]} with"
                    f" {shape[2]}"
                )
        out.append((client, train, test))
    return out


def from_clients(
    clients,
    *,
    num_classes: int | None = None,
    test_fraction: float = 0.0,
    seed: int = 0,
    name: str = "clients",
) -> FederatedDataset:
    """The checked ``clients`` (``check_clients``) as one ``FederatedDataset`` whose client k is the
    k-th id; ``num_classes`` None: the largest label + 1 (a model with more outputs widens it,
    ``training.fit_to_data``)."""
    checked = check_clients(clients, num_classes)
    given_tests = any(test is not None and len(test[0]) for _, _, test in checked)
    xs, ys, train, test, start = [], [], [], [], 0
    for _, (x, y), held in checked:
        xs.append(x)
        ys.append(y)
        train.append(np.arange(start, start + len(x)))
        start += len(x)
        if held is not None and len(held[0]):
            xs.append(held[0])
            ys.append(held[1])
            test.append(np.arange(start, start + len(held[0])))
            start += len(held[0])
        else:
            test.append(np.zeros(0, np.int64))
    if not given_tests:
        if test_fraction <= 0:
            raise ValueError(
                f"data source {name!r}: no client has test data; give clients (x, y) test arrays"
                " ({'train': ..., 'test': ...}) or set data.test_fraction > 0 to hold some out"
            )
        train, test = split_train_test(train, test_fraction, np.random.default_rng(seed))
    y_all = np.concatenate(ys)
    inferred = num_classes is None
    classes = int(y_all.max()) + 1 if inferred else num_classes
    ids = tuple(client for client, _, _ in checked)
    return FederatedDataset(
        np.concatenate(xs),
        y_all,
        tuple(train),
        tuple(test),
        np.sort(np.concatenate(test)),
        classes,
        name=name,
        metadata={
            "client_ids": ids,
            "client_kind": "client",
            "num_classes_inferred": inferred,
            "privacy_unit": (
                f"a client is one id of data source {name!r}, as given ({len(ids)} ids): all the"
                " examples under one id are that client's"
            ),
        },
    )


def _parts(client, value):
    """``((x, y), (x_test, y_test) or None)`` of one client's value."""
    if isinstance(value, Mapping) and "train" in value:
        unknown = set(value) - {"train", "test"}
        if unknown:
            raise ValueError(
                f"client {client!r}: keys {sorted(map(str, unknown))} unknown; use 'train' and"
                " optionally 'test'"
            )
        return _pair(client, "train", value["train"]), (
            _pair(client, "test", value["test"]) if value.get("test") is not None else None
        )
    return _pair(client, "train", value), None


def _pair(client, part: str, value):
    if isinstance(value, Mapping) and set(value) == {"x", "y"}:
        return value["x"], value["y"]
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value
    raise ValueError(
        f"client {client!r} ({part}): expected (x, y) arrays or {{'x': ..., 'y': ...}}, got"
        f" {_kind(value)}"
    )


def _arrays(client, part: str, x, y, num_classes):
    """``(x float32, y int32)`` of one client's part, checked."""
    x, y = np.asarray(x), np.asarray(y)
    where = f"client {client!r} ({part})"
    if x.ndim == 0 or y.ndim == 0 or len(x) != len(y):
        raise ValueError(
            f"{where}: x has {len(x) if x.ndim else 'no'} examples but y has"
            f" {len(y) if y.ndim else 'no'}; they must have one label (row) per example"
        )
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
        raise ValueError(f"{where}: x must be numbers, got dtype {x.dtype}")
    x = x.astype(np.float32)
    bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1) if len(x) else np.zeros(0, bool)
    if bad.any():
        raise ValueError(f"{where}: x holds NaN or Inf (example {int(np.flatnonzero(bad)[0])})")
    if y.ndim > 2:
        raise ValueError(f"{where}: labels must be (n,) or (n, T) per-token targets, got {y.shape}")
    if len(y) and not np.issubdtype(y.dtype, np.integer):
        whole = np.issubdtype(y.dtype, np.number) and np.all(np.mod(y, 1) == 0)
        if not whole:
            raise ValueError(f"{where}: labels must be integer class indices, got dtype {y.dtype}")
    y = y.astype(np.int64)
    for label_bad, what in (
        (y < 0, "is negative"),
        (y >= (num_classes or np.iinfo(np.int64).max), f"is outside the {num_classes} classes"),
    ):
        rows = label_bad.reshape(len(y), -1).any(axis=1) if len(y) else np.zeros(0, bool)
        if rows.any():
            k = int(np.flatnonzero(rows)[0])
            raise ValueError(
                f"{where}: label {y[k].tolist()} (example {k}) {what}; labels are class indices in"
                f" [0, {num_classes or 'num_classes'})"
            )
    return x, y.astype(np.int32)


def _kind(value) -> str:
    return f"{type(value).__name__} {value!r}"[:80]
