"""Statistics of a federated dataset: example counts, classes per client, label histograms, and a
plot of how labels spread across clients (to check a partition before spending compute on it)."""

from __future__ import annotations

import numpy as np

from fedjax_dp.data.federated_dataset import FederatedDataset


def label_matrix(ds: FederatedDataset, split: str = "train") -> np.ndarray:
    """``(num_clients, num_classes)`` label counts (token targets count per token, padding
    included)."""
    lists = ds.client_train if split == "train" else ds.client_test
    out = np.zeros((ds.num_clients, ds.num_classes), dtype=np.int64)
    for k, idx in enumerate(lists):
        out[k] = np.bincount(ds.y[idx].ravel(), minlength=ds.num_classes)
    return out


def _quantiles(values: np.ndarray) -> dict[str, float]:
    q = np.quantile(values, [0.0, 0.25, 0.5, 0.75, 1.0]) if len(values) else [np.nan] * 5
    return dict(zip(("min", "q25", "median", "q75", "max"), map(float, q)))


def statistics(ds: FederatedDataset) -> dict:
    """Per-client quantiles of example counts and classes held, plus the global label histogram."""
    counts = label_matrix(ds, "train")
    test_sizes = np.array([len(i) for i in ds.client_test])
    return {
        "name": ds.name,
        "num_clients": ds.num_clients,
        "num_classes": ds.num_classes,
        "train_examples": int(ds.train_sizes().sum()),
        "test_examples_clients": int(test_sizes.sum()),
        "central_test_examples": int(len(ds.central_test)),
        "train_per_client": _quantiles(ds.train_sizes()),
        "test_per_client": _quantiles(test_sizes),
        "classes_per_client": _quantiles((counts > 0).sum(axis=1)),
        "label_histogram": counts.sum(axis=0).tolist(),
    }


def describe(ds: FederatedDataset) -> str:
    """A printable summary of ``statistics``."""
    s = statistics(ds)
    q = lambda d: " ".join(f"{k}={v:g}" for k, v in d.items())  # noqa: E731
    return "\n".join(
        [
            (
                f"{s['name']}: {s['num_clients']} clients, {s['num_classes']} classes,"
                f" {s['train_examples']} train examples, {s['test_examples_clients']} client test"
                f" examples, {s['central_test_examples']} central test examples"
            ),
            f"  train examples per client: {q(s['train_per_client'])}",
            f"  test examples per client:  {q(s['test_per_client'])}",
            f"  classes per client:        {q(s['classes_per_client'])}",
            f"  label histogram: {s['label_histogram']}",
        ]
    )


def plot_label_distribution(ds: FederatedDataset, path: str, max_clients: int = 50) -> str:
    """Stacked bars of each client's label counts (first ``max_clients`` clients) to a PNG."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure  # not pyplot: no backend switch under a notebook

    counts = label_matrix(ds, "train")[:max_clients]
    fig = Figure(figsize=(max(6, 0.18 * len(counts)), 4))
    ax = fig.add_subplot()
    bottom = np.zeros(len(counts))
    cmap = colormaps["tab20"].resampled(ds.num_classes)
    for c in range(ds.num_classes):
        ax.bar(np.arange(len(counts)), counts[:, c], bottom=bottom, color=cmap(c), width=0.9)
        bottom += counts[:, c]
    (
        ax.set_xlabel("client"),
        ax.set_ylabel("training examples"),
        ax.set_title(f"label distribution: {ds.name}"),
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
