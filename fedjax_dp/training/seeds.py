"""Several seeds of one config: each run in ``<workdir>/seed_<s>``, then the mean and a 95 %
Student-t confidence interval over seeds of every final metric, of the best accuracy and of epsilon
(``seeds_summary.json``), and the curves with their bands (``seeds.png``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats

CURVE_KEYS = ("test_accuracy", "personalized_accuracy", "train_loss", "epsilon")


def interval(values) -> dict:
    """mean, sample std, the 95 % t-interval's half width (null for one seed) and the values."""
    values = np.asarray([v for v in values if v is not None and math.isfinite(v)], float)
    if not len(values):
        return {"mean": None, "std": None, "ci95_half_width": None, "n": 0, "values": []}
    std = float(values.std(ddof=1)) if len(values) > 1 else None
    half = (
        float(stats.t.ppf(0.975, len(values) - 1) * std / math.sqrt(len(values)))
        if std is not None
        else None
    )
    return {
        "mean": float(values.mean()),
        "std": std,
        "ci95_half_width": half,
        "n": len(values),
        "values": values.tolist(),
    }


@dataclasses.dataclass
class SeedsSummary:
    workdir: str
    seeds: list
    workdirs: list
    final: dict  # metric -> interval(...)
    best_accuracy: dict
    epsilon: dict | None
    formal: bool | None
    rounds: list
    stop_reasons: list
    interrupted: bool = False  # a seed's run was interrupted (the CLI exits 130)
    diverged: bool = False  # a seed's run diverged (the CLI exits 3)

    @property
    def rounds_min(self) -> int:
        return min(self.rounds)

    @property
    def stop_reason(self) -> str | None:
        return "; ".join(sorted({r for r in self.stop_reasons if r})) or None

    def format(self) -> str:
        def show(entry):
            if entry["mean"] is None:
                return "n/a"
            half = entry["ci95_half_width"]
            return f"{entry['mean']:.4f}" + (
                f" +- {half:.4f} (95 % CI, n={entry['n']})" if half is not None else " (n=1)"
            )

        lines = [
            f"{'workdir':<26}{self.workdir}",
            f"{'seeds':<26}{','.join(map(str, self.seeds))}",
            f"{'rounds':<26}{', '.join(map(str, self.rounds))}"
            + (f"  (stopped: {self.stop_reason})" if self.stop_reason else ""),
            f"{'best accuracy':<26}{show(self.best_accuracy)}",
        ]
        lines += [f"{'final ' + k:<26}{show(v)}" for k, v in self.final.items()]
        if self.epsilon is not None:
            lines.append(
                f"{'epsilon spent':<26}{show(self.epsilon)}"
                + (
                    "  (formal: false: NO differential-privacy guarantee)"
                    if self.formal is False
                    else ""
                )
            )
        return "\n".join(lines)


def summarize(workdir: str, seeds: list[int], summaries: list, workdirs: list[str]) -> SeedsSummary:
    keys = sorted({k for s in summaries for k in s.final})
    epsilons = [s.epsilon for s in summaries]
    return SeedsSummary(
        workdir,
        list(seeds),
        list(workdirs),
        {k: interval([s.final.get(k) for s in summaries]) for k in keys},
        interval([s.best_accuracy for s in summaries]),
        interval(epsilons) if any(e is not None for e in epsilons) else None,
        (
            None
            if all(s.formal is None for s in summaries)
            else all(s.formal is not False for s in summaries)
        ),
        [s.rounds for s in summaries],
        [s.stop_reason for s in summaries],
        any(s.interrupted for s in summaries),
        any(s.diverged for s in summaries),
    )


def curves(metrics_per_seed: list[list[dict]]) -> dict[str, tuple]:
    """metric -> (rounds, mean, low, high) over the rounds every seed evaluated."""
    out = {}
    for key in CURVE_KEYS:
        series = [
            {r["round"]: r[key] for r in rows if r.get(key) is not None}
            for rows in metrics_per_seed
        ]
        common = sorted(set.intersection(*(set(s) for s in series))) if series else []
        if not common:
            continue
        table = np.asarray([[s[t] for t in common] for s in series], float)
        mean = table.mean(axis=0)
        if len(series) > 1:
            half = (
                stats.t.ppf(0.975, len(series) - 1)
                * table.std(axis=0, ddof=1)
                / math.sqrt(len(series))
            )
        else:
            half = np.zeros_like(mean)
        out[key] = (common, mean, mean - half, mean + half)
    return out
