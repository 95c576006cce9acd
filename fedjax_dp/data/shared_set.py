"""A shared set mixed into every client's data: the data side of FedShare (Zhao et al. 2018,
"Federated Learning with Non-IID Data", §4), chosen by an algorithm's registry entry
(``shares_server_set``). In seed 002's baselines the shared set has the size of FedMeta's D_meta
(about 1 % of the data); its examples are public to every client.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_dp.data.federated_dataset import FederatedDataset
from fedjax_dp.data.server_sets import ServerSet


def share_with_clients(dataset: FederatedDataset, shared: ServerSet) -> FederatedDataset:
    """Appends the shared examples to ``dataset.x``/``y`` and to every client's training indices.

    Client test sets and the central test set are unchanged. The weight n_k of a client in FedAvg's
    mean becomes its own count plus the shared count, as in a client that really holds both.
    """
    if len(shared.y) == 0:
        raise ValueError("the shared set is empty: FedShare needs at least one shared example")
    if shared.x.shape[1:] != dataset.x.shape[1:] or shared.y.shape[1:] != dataset.y.shape[1:]:
        raise ValueError(
            f"shared examples have shape {shared.x.shape[1:]} / labels {shared.y.shape[1:]}, "
            f"the dataset {dataset.x.shape[1:]} / {dataset.y.shape[1:]}"
        )
    start = len(dataset.y)
    shared_idx = np.arange(start, start + len(shared.y))
    return dataclasses.replace(
        dataset,
        x=np.concatenate([dataset.x, shared.x.astype(dataset.x.dtype)]),
        y=np.concatenate([dataset.y, shared.y.astype(dataset.y.dtype)]),
        client_train=tuple(np.concatenate([idx, shared_idx]) for idx in dataset.client_train),
        name=f"{dataset.name}+shared{len(shared.y)}",
        metadata={**dataset.metadata, "shared_examples": len(shared.y)},
    )
