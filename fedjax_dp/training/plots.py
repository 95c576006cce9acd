"""Figures of a run and of a set of runs: ``results.png`` (accuracy, loss and epsilon against
rounds, and the final per-client accuracy distribution), ``seeds.png`` (mean and 95 % confidence
band over seeds) and accuracy against epsilon for sweeps. Every figure names its privacy parameters
in the title."""

from __future__ import annotations

import math
import textwrap

import numpy as np

ACCURACY_CURVES = (
    ("test_accuracy", "central test", "-", "o"),
    ("client_accuracy", "mean per-client (global model)", "--", "s"),
    ("personalized_accuracy", "mean personalised (own model, own test data)", "-", "^"),
    ("validation_accuracy", "server validation set", ":", "x"),
)


def _legend(ax) -> None:
    """A legend where something was drawn (a run stopped before round 1 has no curves)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _figure(panels: int, width: float = 4.2, height: float = 3.6):
    """A figure not registered with pyplot (no backend switch: a notebook's inline plots keep
    working)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * panels, height))
    return fig, [fig.add_subplot(1, panels, i + 1) for i in range(panels)]


ADAPTED_SETTINGS = (
    ("hypergrad_client_lr", "client learning rate"),
    ("hypergrad_server_lr", "server learning rate"),
)
"""The settings a run adapts with hyper-gradients, as logged in ``metrics.jsonl``."""


def _series(rows: list[dict], key: str) -> tuple[list, list]:
    points = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
    return ([p[0] for p in points], [p[1] for p in points]) if points else ([], [])


def plot_run(
    rows: list[dict],
    path: str,
    title: str,
    client_accuracies=None,
    client_accuracy_label: str = "",
    client_test_sizes=None,
) -> str:
    """One PNG with up to five panels: accuracy (every evaluated curve, round 0 = the initial
    model), training loss, epsilon spent (where privacy is tracked; dashed where it has no formal
    guarantee), the learning rates adapted by hyper-gradients (where they adapt), and a histogram
    of the final per-client accuracies."""
    has_eps = any(r.get("epsilon") is not None for r in rows)
    settings = [k for k, _ in ADAPTED_SETTINGS if any(r.get(k) is not None for r in rows)]
    panels = (
        ["accuracy", "loss"]
        + (["epsilon"] if has_eps else [])
        + (["settings"] if settings else [])
        + (["clients"] if client_accuracies is not None and len(client_accuracies) else [])
    )
    fig, axes = _figure(len(panels))
    axes = dict(zip(panels, axes))
    ax = axes["accuracy"]
    # (x, y, line) already plotted: an identical curve joins its label instead of hiding under it
    drawn = []
    for key, label, style, marker in ACCURACY_CURVES:
        x, y = _series(rows, key)
        same = [line for (x0, y0, line) in drawn if x0 == x and np.allclose(y0, y)]
        if same:
            same[0].set_label(f"{same[0].get_label()} = {label}")
        elif x:
            drawn.append(
                (x, y, ax.plot(x, y, linestyle=style, marker=marker, markersize=3, label=label)[0])
            )
    ax.set(xlabel="round", ylabel="accuracy", title="accuracy")
    _legend(ax)
    ax = axes["loss"]
    for key, label in (
        ("train_loss", "cohort training loss"),
        ("train_data_loss", "its data term (no regulariser)"),
        ("test_loss", "central test loss"),
    ):
        x, y = _series(rows, key)
        if x:
            ax.plot(x, y, label=label)
    ax.set(xlabel="round", ylabel="loss", title="loss")
    _legend(ax)
    if has_eps:
        ax = axes["epsilon"]
        x, y = _series(rows, "epsilon")
        formal = all(r.get("formal", True) for r in rows if r.get("epsilon") is not None)
        ax.plot(
            x,
            y,
            linestyle="-" if formal else "--",
            label="epsilon spent" + ("" if formal else " (formal: false, no DP guarantee)"),
        )
        ax.set(xlabel="round", ylabel="epsilon", title="privacy spent")
        _legend(ax)
    if settings:  # the learning rates adapted by hyper-gradients (``hypergrad``)
        ax = axes["settings"]
        for key, label in ADAPTED_SETTINGS:
            x, y = _series(rows, key)
            if x:
                ax.plot(x, y, label=label)
        ax.set(xlabel="round", ylabel="learning rate", yscale="log", title="adapted settings")
        _legend(ax)
    if "clients" in axes:
        ax = axes["clients"]
        values = np.asarray(client_accuracies, float)
        ax.hist(values, bins=min(20, max(5, len(values) // 5)), range=(0, 1))
        ax.axvline(values.mean(), color="k", linestyle="--", label=f"mean {values.mean():.3f}")
        ax.set(
            xlabel=client_accuracy_label or "final accuracy per client",
            ylabel="clients",
            title="per-client accuracy" + test_sizes_note(client_test_sizes),
        )
        _legend(ax)
    for ax in axes.values():
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def metric_range(metric: str) -> tuple[float, float]:
    """The values ``metric`` can take: [0, 1] for an accuracy or a fraction, [0, inf) for a loss or
    epsilon."""
    if "accuracy" in metric or "fraction" in metric:
        return 0.0, 1.0
    if "loss" in metric or "epsilon" in metric:
        return 0.0, math.inf
    return -math.inf, math.inf


def seed_band(metric: str, low, high):
    """A 95 % t-interval clipped to the metric's range (two seeds gave an accuracy band from -0.6 to
    1.8)."""
    lo, hi = metric_range(metric)
    return np.clip(np.asarray(low, float), lo, hi), np.clip(np.asarray(high, float), lo, hi)


def band_label(seeds: int) -> str:
    """The band's legend: the interval, n, and a warning below 3 seeds (t_{0.975, 1} = 12.7)."""
    label = f"95 % t-interval over n = {seeds} seeds"
    return label + (" (n < 3: too few for a usable interval)" if seeds < 3 else "")


def plot_seeds(curves: dict[str, tuple], path: str, title: str, seeds: int = 0) -> str:
    """``curves``: metric -> (rounds, mean, low, high) over ``seeds`` seeds; lines with their 95 %
    bands, clipped to each metric's range (``seed_band``) and labelled with n (``band_label``)."""
    seeds_figure(curves, title, seeds).savefig(path, dpi=110)
    return path


def seeds_figure(curves: dict[str, tuple], title: str, seeds: int = 0):
    """``plot_seeds``' figure. The legend is the same for every panel, so it is one, below the
    panels and outside them (in a panel it covered the curves, and the long band label ran past
    the figure's edge)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * max(len(curves), 1), 3.9), layout="constrained")
    axes = [fig.add_subplot(1, max(len(curves), 1), i + 1) for i in range(len(curves))]
    for ax, (metric, (x, mean, low, high)) in zip(axes, curves.items()):
        ax.plot(x, mean, label="mean over seeds")
        low, high = seed_band(metric, low, high)
        ax.fill_between(
            x, low, high, alpha=0.25, label=band_label(seeds) if seeds else "95 % t-interval"
        )
        ax.set(xlabel="round", ylabel=metric, title=metric)
        ax.grid(alpha=0.3)
    if axes and axes[0].get_legend_handles_labels()[0]:
        fig.legend(
            *axes[0].get_legend_handles_labels(),
            loc="outside lower center",
            ncols=2 if len(axes) > 1 else 1,
            fontsize=7,
        )
    fig.suptitle(title, fontsize=9)
    return fig


def test_sizes_note(sizes) -> str:
    """How many test examples a client holds, for the per-client accuracy histogram (each bar's
    resolution)."""
    if sizes is None or not len(sizes):
        return ""
    sizes = np.asarray(sizes)
    return (
        f"\n({int(sizes.min())}-{int(sizes.max())} test examples per client, median"
        f" {int(np.median(sizes))})"
    )


def plot_accuracy_vs_epsilon(points: dict[str, list[tuple]], path: str, title: str) -> str:
    """``points``: method -> [(epsilon, accuracy, half_width or 0), ...]; one line per method with
    error bars (the 95 % interval over seeds where there are several)."""
    fig, (ax,) = _figure(1, 5, 3.8)
    for method, rows in points.items():
        rows = sorted(rows)
        ax.errorbar(
            [r[0] for r in rows],
            [r[1] for r in rows],
            yerr=[r[2] for r in rows],
            marker="o",
            capsize=3,
            label=method,
        )
    ax.set(xscale="log", xlabel="epsilon (at the run's delta)", ylabel="final accuracy")
    ax.set_title(textwrap.fill(title, 70), fontsize=8)
    ax.grid(alpha=0.3)
    _legend(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_sweep(
    runs: list[dict], keys: list[str], metric: str, path: str, title: str, best: int | None
) -> str:
    """One panel per swept key: each run's ``metric`` against its value of that key (a log axis
    where the positive values span more than a decade; text values at evenly spaced positions), the
    released (best) run ringed."""
    fig, axes = _figure(max(len(keys), 1), 4.2, 3.6)
    for ax, key in zip(axes, keys):
        points = [
            (r["settings"].get(key), r["metric"], r["index"])
            for r in runs
            if r.get("metric") is not None
        ]
        values = [p[0] for p in points]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric:
            xs = [float(v) for v in values]
        else:
            labels = sorted({str(v) for v in values})
            xs = [labels.index(str(v)) for v in values]
            ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.scatter(xs, [p[1] for p in points], s=18, label="runs")
        chosen = [(x, p[1]) for x, p in zip(xs, points) if p[2] == best]
        if chosen:
            ax.scatter(*zip(*chosen), s=90, facecolors="none", edgecolors="red", label="released")
        positive = [x for x in xs if x > 0]
        if numeric and len(positive) == len(xs) and xs and max(xs) > 10 * min(xs):
            ax.set_xscale("log")
        ax.set(xlabel=key, ylabel=metric, title=textwrap.shorten(f"{metric} against {key}", 48))
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
