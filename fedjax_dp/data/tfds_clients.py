"""Federated data from a TFDS builder whose examples carry the client they belong to.

``tfds_clients(builder, "writer_id")`` reads each split of a prepared builder through
``as_data_source`` (random-access ArrayRecord files: no TensorFlow, as ``tfds_source``) and groups
its examples by that feature: one client per distinct value, with its examples of the ``test``
split as its local test data (an id met only in the test split has nothing to train on and is not
a client of the run). ``uint8`` inputs (images) are scaled to [0, 1]; the class count is the
label feature's where it is a ``ClassLabel``.
"""

from __future__ import annotations

import numpy as np

from fedjax_dp.data.tfds_source import _records


def tfds_clients(
    builder,
    client_feature: str,
    *,
    x_feature: str = "image",
    y_feature: str = "label",
    splits: tuple[str, str] = ("train", "test"),
) -> tuple[dict, int | None]:
    """``(clients, num_classes)``: ``{client id: {"train": (x, y), "test": (x, y)}}`` for
    ``client_data.from_clients`` and the label feature's class count (None where it has none)."""
    features = builder.info.features
    for role, key in (("client", client_feature), ("input", x_feature), ("label", y_feature)):
        if key not in features:
            raise ValueError(
                f"TFDS builder {builder.name!r} has no {role} feature {key!r}; its features:"
                f" {sorted(features.keys())}"
            )
    available = set(builder.info.splits.keys())
    if splits[0] not in available:
        raise ValueError(
            f"TFDS builder {builder.name!r} has no split {splits[0]!r}; its splits:"
            f" {sorted(available)}"
        )
    clients: dict = {}
    for part, split in zip(("train", "test"), splits):
        if split not in available:
            continue
        grouped: dict = {}
        for record in _records(builder.as_data_source(split=split)):
            client = record[client_feature]
            client = client.decode() if isinstance(client, bytes) else np.asarray(client).item()
            grouped.setdefault(client, ([], []))
            grouped[client][0].append(np.asarray(record[x_feature]))
            grouped[client][1].append(np.asarray(record[y_feature]))
        for client, (xs, ys) in grouped.items():
            x = np.stack(xs)
            x = x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x
            clients.setdefault(client, {})[part] = (x, np.stack(ys))
    clients = {c: v for c, v in sorted(clients.items(), key=lambda kv: str(kv[0])) if "train" in v}
    return clients, getattr(features[y_feature], "num_classes", None)
