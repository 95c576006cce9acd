"""``fedjax_dp.sweep``: hyper-parameter search whose selection pays its privacy cost.

Every run of a sweep trains on the clients' data, so the released (best) model leaks more than one
run's epsilon (Papernot and Steinke, "Hyperparameter tuning with Renyi differential privacy", ICLR
2022). The sweep accounts for it before it starts (``privacy.accounting.selection``):

* ``runs="poisson"`` (the default): the number of runs K is drawn from Poisson(``num_runs``) by a
  seeded numpy Generator (the draw is recorded; K = 0 releases nothing), each run's settings drawn
  independently and uniformly from the grid (or from the distribution), each with its own seed; the
  released model costs ``RepeatAndSelectDpEvent`` of one run's event, by RDP;
* ``runs="negative_binomial"``: K from the truncated negative binomial of mean ``num_runs`` and
  shape ``shape`` (eta; 1: geometric, 0: logarithmic), likewise;
* ``runs="fixed"``: every point of a grid once (or ``num_runs`` draws of a distribution): a fixed
  number of runs has no selection bound, so the released model is accounted by composing them all,
  and the summary says so.

Beside the selection's epsilon the summary gives one run's and the naive composition of
``num_runs`` runs. The metric that picks the best run is itself a release: computed on server-held
data (the central test set, a server validation set) it costs nothing and is labelled so; on the
clients' own data it is a release this sweep does not account, and is labelled so too.

    summary = fedjax_dp.sweep("dp_fedavg_mnist", {"dp.clip_norm": [0.5, 1.0]}, workdir="sw",
                              runs="fixed", rounds=...)

Each run is an ``Experiment`` in ``<workdir>/run_<i>``; a run whose folder already holds its
finished summary (same config) is not run again, a run stopped part-way is resumed.
``vectorized=True`` trains the runs to start in lockstep as one vmapped program
(``training.run_batch``: runs differing in their seed and scalar settings, ``BATCHABLE_KEYS``, with
each run's numbers up to float32 rounding); a sweep over another key is refused before any run.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import os
import pickle

import ml_collections
import numpy as np

from fedjax_dp import configs
from fedjax_dp.core import hosts
from fedjax_dp.experiment import Experiment, run_together
from fedjax_dp.privacy.accounting import selection
from fedjax_dp.training import plots, results
from fedjax_dp.training.callbacks import Callback
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.privacy_plan import planned_run_event
from fedjax_dp.training.reporting import RunSummary
from fedjax_dp.training.run_batch import check_batchable

__all__ = ["sweep", "SweepSummary"]

MODES = ("max", "min")
SERVER_HELD = ("test_accuracy", "test_loss", "validation_accuracy", "best_accuracy")
"""Metrics computed on data the server holds (the central test set, a server validation set)."""
SCALES = ("log", "linear")


@dataclasses.dataclass
class SweepSummary:
    """What a sweep ends with (``sweep_summary.json``; ``format()`` is the table the CLI prints).

    Attributes:
      workdir: the sweep's folder (each run in ``run_<i>``).
      metric, mode: what picked the best run ('max' or 'min' of ``metric``).
      runs: one dict per run: index, workdir, settings (the swept keys' values), seed, metric,
        epsilon (the run's own, by its accountant), rounds, stop_reason.
      best: the released run's dict, or None where no run was drawn (nothing is released).
      privacy: the selection's accounting (``selection.SelectionCost`` fields, the validation
        metric's data and notes), or the reason it could not be computed.
      draw: how many runs were drawn and how.
    """

    workdir: str
    metric: str
    mode: str
    runs: list
    best: dict | None
    privacy: dict
    draw: dict
    interrupted: bool = False
    diverged: bool = False

    @property
    def rounds_min(self) -> int:
        """The fewest rounds a run trained (0 where none ran)."""
        return min((r["rounds"] for r in self.runs), default=0)

    @property
    def stop_reason(self) -> str | None:
        return "; ".join(sorted({r["stop_reason"] for r in self.runs if r["stop_reason"]})) or None

    def format(self) -> str:
        """Each run's settings and metric, the released one marked, and the privacy lines."""
        lines = [
            f"{'workdir':<26}{self.workdir}",
            f"{'runs':<26}{self.draw['num_runs']} ({self.draw['how']})",
        ]
        for r in self.runs:
            mark = "*" if self.best and r["index"] == self.best["index"] else " "
            settings = ", ".join(f"{k}={v}" for k, v in r["settings"].items())
            value = "n/a" if r["metric"] is None else f"{r['metric']:.4f}"
            lines.append(f" {mark} run_{r['index']:<20}{self.metric} {value}  ({settings})")
        if self.best is None:
            lines.append(f"{'released':<26}nothing (no run was drawn)")
        p = self.privacy
        if p.get("selected_epsilon") is not None:
            lines += [
                f"{'epsilon, one run':<26}{p['single_run_epsilon']:.4g}"
                f" (RDP, delta {p['delta']:g})",
                f"{'epsilon, released model':<26}{p['selected_epsilon']:.4g} ({p['accounting']})",
                f"{'epsilon, runs composed':<26}{p['composed_epsilon']:.4g}"
                f" ({p['composed_runs']} runs, naive composition)",
            ]
        else:
            lines.append(f"{'epsilon, released model':<26}not computed: {p.get('note')}")
        lines.append(f"{'validation metric':<26}{p['validation_data']}")
        return "\n".join(lines)


def sweep(
    config,
    grid_or_distribution: dict,
    *,
    workdir: str | None = None,
    metric: str = "test_accuracy",
    mode: str = "max",
    num_runs: float | None = None,
    runs: str = selection.DEFAULT_RUNS,
    shape: float = 1.0,
    budget: float | None = None,
    seed: int = 0,
    overrides: dict | None = None,
    vectorized: bool = False,
    **run_options,
) -> SweepSummary:
    """Runs a grid or random search over dotted config keys and releases the best run, its
    selection accounted (module docstring).

    Args:
      config: a shipped config's name, a config file's path, a ``ConfigDict`` or an ``Experiment``.
      grid_or_distribution: dotted key -> a list of values (every value a list: a grid, their
        cartesian product), or -> a callable ``f(rng) -> value`` or ``(low, high, "log" |
        "linear")`` (random search; a list there is a uniform choice).
      workdir: the sweep's folder (default ``results/<algorithm>-sweep``); run i in ``run_<i>``.
      metric, mode: the final metric that picks the best run, and 'max' or 'min'.
      num_runs: the mean number of runs ('poisson', 'negative_binomial') or the number of draws
        of a distribution ('fixed'); default: the grid's size, 10 for a distribution.
      runs: 'poisson' (default), 'negative_binomial' (of shape ``shape``) or 'fixed'.
      budget: a target epsilon for the released model: a sweep whose selection would spend more is
        refused (``ValueError`` naming both) before any data loads.
      seed: the seed of the draws (the number of runs, each run's settings).
      overrides: dotted keys set in every run (what ``Experiment`` takes).
      vectorized: the runs still to start train as one vmapped program (module docstring); then
        ``run_options`` take ``overwrite`` and ``verbose``.
      run_options: what ``Experiment.run`` takes (``progress``, ``overwrite``, ...).

    Returns:
      The ``SweepSummary``, also written to ``<workdir>/sweep_summary.json`` with ``sweep.png``.
    """
    base = Experiment(config.config if isinstance(config, Experiment) else config, overrides)
    if mode not in MODES:
        raise ValueError(f"sweep: mode={mode!r} unknown; choose one of {MODES}")
    if not grid_or_distribution:
        raise ValueError("sweep: nothing to sweep: give at least one key and its values")
    space = {key: _checked_space(key, value) for key, value in grid_or_distribution.items()}
    grid = all(isinstance(v, list) for v in space.values())
    points = list(itertools.product(*space.values())) if grid else None
    if num_runs is None:
        num_runs = len(points) if grid else 10
    if runs == "fixed" and grid and num_runs != len(points):
        raise ValueError(
            f"sweep: runs='fixed' over a grid runs each of its {len(points)} points once; got"
            f" num_runs={num_runs}"
        )
    selection.check_runs(runs, num_runs, shape if runs == "negative_binomial" else None)
    rng = np.random.default_rng(seed)
    drawn = selection.draw_num_runs(
        rng, runs, num_runs, shape if runs == "negative_binomial" else None
    )
    keys = list(space)
    if runs == "fixed" and grid:
        settings = [dict(zip(keys, point)) for point in points]
    else:
        settings = [_draw(space, rng) for _ in range(drawn)]
    own_seeds = runs != "fixed" and "seed" not in space
    experiments = [
        _experiment(base, s, base.config.seed + i if own_seeds else None)
        for i, s in enumerate(settings)
    ]
    privacy = _privacy(base, space, points, experiments, runs, num_runs, shape, metric)
    if budget is not None:
        selected = privacy.get("selected_epsilon")
        if selected is None:
            raise ValueError(
                f"sweep: budget={budget}: the released model's epsilon cannot be computed before"
                f" the runs ({privacy['note']})"
            )
        if selected > budget:
            raise ValueError(
                f"sweep: budget={budget}: the released model would spend epsilon {selected:.4g}"
                f" ({privacy['accounting']}; one run {privacy['single_run_epsilon']:.4g})"
            )
    if vectorized and experiments:
        check_batchable([e.config for e in experiments])
    workdir = workdir or os.path.join("results", f"{base.config.algorithm}-sweep")
    os.makedirs(workdir, exist_ok=True)
    run_dirs = [os.path.join(workdir, f"run_{i}") for i in range(len(experiments))]
    together = _run_fresh_together(experiments, run_dirs, run_options) if vectorized else {}
    records, summaries, ran = [], [], []
    for i, (setting, experiment) in enumerate(zip(settings, experiments)):
        run_dir = run_dirs[i]
        summary = together.get(i) or _run_or_resume(experiment, run_dir, run_options)
        ran.append(_read_run_event(run_dir))
        summaries.append(summary)
        records.append(
            {
                "index": i,
                "workdir": run_dir,
                "settings": setting,
                "seed": int(experiment.config.seed),
                "metric": _metric(summary, metric),
                "epsilon": summary.epsilon,
                "rounds": summary.rounds,
                "stop_reason": summary.stop_reason,
            }
        )
        if summary.interrupted:
            break
    scored = [r for r in records if r["metric"] is not None and math.isfinite(r["metric"])]
    pick = max if mode == "max" else min
    best = pick(scored, key=lambda r: r["metric"]) if scored else None
    how = (
        f"every point of a {len(points)}-point grid"
        if runs == "fixed" and grid
        else f"{runs} draw (mean {num_runs:g}, seed {seed})"
        if runs != "fixed"
        else f"{num_runs} draws (seed {seed})"
    )
    draw = {"runs": runs, "num_runs": drawn, "mean": num_runs, "seed": seed, "how": how}
    if runs == "negative_binomial":
        draw["shape"] = shape
    if "selected_epsilon" not in privacy and records and all(e is not None for e in ran):
        privacy = _privacy(base, space, points, experiments, runs, num_runs, shape, metric, ran=ran)
    if drawn == 0:
        privacy["notes"].append("no run was drawn (K = 0): nothing is released")
    summary = SweepSummary(
        workdir,
        metric,
        mode,
        records,
        best,
        privacy,
        draw,
        any(s.interrupted for s in summaries),
        any(s.diverged for s in summaries),
    )
    results.write_json(
        os.path.join(workdir, "sweep_summary.json"),
        {**dataclasses.asdict(summary), "swept": keys},
        indent=2,
    )
    if records:
        plots.plot_sweep(
            records,
            keys,
            metric,
            os.path.join(workdir, "sweep.png"),
            f"{base.config.algorithm}: {metric} of {len(records)} runs; released model epsilon "
            + (
                f"{privacy['selected_epsilon']:.3g}"
                if privacy.get("selected_epsilon") is not None
                else "n/a"
            ),
            best["index"] if best else None,
        )
    return summary


def _checked_space(key: str, value):
    """A swept key's values as given (a list, a callable, or a ``(low, high, scale)`` range),
    refused with the key named otherwise."""
    if isinstance(value, list):
        if not value:
            raise ValueError(f"sweep: {key} has no values")
        return value
    if callable(value):
        return value
    if (
        isinstance(value, tuple)
        and len(value) == 3
        and value[2] in SCALES
        and all(isinstance(v, (int, float)) for v in value[:2])
        and value[0] <= value[1]
        and (value[2] == "linear" or value[0] > 0)
    ):
        return value
    raise ValueError(
        f"sweep: {key}={value!r}: give a list of values, a callable f(rng), or (low, high, 'log' |"
        " 'linear') with low <= high (and low > 0 for 'log')"
    )


def _draw(space: dict, rng: np.random.Generator) -> dict:
    """One run's settings: each key's value drawn independently (a list: uniformly)."""
    out = {}
    for key, value in space.items():
        if isinstance(value, list):
            out[key] = value[int(rng.integers(len(value)))]
        elif callable(value):
            out[key] = value(rng)
        else:
            low, high, scale = value
            out[key] = float(
                np.exp(rng.uniform(math.log(low), math.log(high)))
                if scale == "log"
                else rng.uniform(low, high)
            )
        if isinstance(out[key], np.generic):
            out[key] = out[key].item()
    return out


def _experiment(base: Experiment, setting: dict, seed: int | None) -> Experiment:
    cfg = copy.deepcopy(base.config)
    overrides = dict(setting)
    if seed is not None:
        overrides["seed"] = seed
    return Experiment(cfg, overrides)


def _metric(summary: RunSummary, metric: str) -> float | None:
    if metric == "best_accuracy":
        return summary.best_accuracy
    if summary.rounds and metric not in summary.final:
        raise ValueError(
            f"sweep: metric={metric!r} is not among the run's final metrics"
            f" ({', '.join(sorted(summary.final))})"
        )
    value = summary.final.get(metric)
    return None if value is None else float(value)


def validation_data(metric: str) -> str:
    """Whether the selecting metric is computed on server-held data (no privacy cost) or on the
    clients' own data."""
    if metric in SERVER_HELD:
        return "server-held data, no privacy cost"
    return (
        "clients' data: a release this sweep does not account (the selection's epsilon does not"
        " cover it)"
    )


def _privacy(base, space, points, experiments, runs, num_runs, shape, metric, ran=None) -> dict:
    """The selection's accounting, from the run events the trackers will compose (before data),
    or, with ``ran``, from the ``(event, relation)`` each run's tracker composed (after the runs:
    where the event is known only once the data is loaded)."""
    out = {"validation_data": validation_data(metric), "notes": []}
    if ran is not None:
        planned = list(ran)
        unrun = points is not None and runs != "fixed" and len(set(map(str, planned))) > 1
        if not planned or unrun:
            out["note"] = (
                "the runs' events are known only once the data is loaded, and the swept settings"
                " change them: the grid points that did not run have no event to bound"
                if planned
                else "no run was recorded"
            )
            return out
        out["notes"].append(
            "accounted after the runs, from the events their trackers composed (the event is known"
            " only once the data is loaded)"
        )
    else:
        candidates = list(experiments)
        if points is not None and runs != "fixed":
            keys = list(space)
            candidates += [_experiment(base, dict(zip(keys, p)), None) for p in points]
        planned = [planned_run_event(e.config) for e in candidates] or [
            planned_run_event(base.config)
        ]
    if any(p is None for p in planned):
        out["note"] = (
            "no private release is planned, or its event is known only once the data is loaded"
        )
        return out
    relations = {relation for _, relation in planned}
    if len(relations) > 1:
        out["note"] = "the runs' neighbouring relations differ (Poisson and fixed-size sampling)"
        return out
    events = list(dict.fromkeys(event for event, _ in planned))
    continuous = [k for k, v in space.items() if not isinstance(v, list)]
    if len(events) > 1 and continuous:
        raise ValueError(
            f"sweep: the swept keys change each run's privacy event, and {', '.join(continuous)}"
            " is drawn from a continuous range, whose worst case is not known: list its values"
        )
    event = selection.worst_of(events, relations.pop())
    if len(events) > 1:
        out["notes"].append(
            "the swept settings change the run's event: each figure is the worst candidate's at"
            " every RDP order (for a fixed grid, an upper bound on composing each run's own)"
        )
    delta = float(base.config.privacy.delta)
    if base.config.privacy.accountant != "rdp":
        out["notes"].append(
            f"each run's own epsilon is its {base.config.privacy.accountant} accountant's; the"
            " selection is accounted by RDP (the accountant that composes RepeatAndSelectDpEvent),"
            " one run's RDP figure beside it"
        )
    cost = selection.selection_cost(
        event,
        delta,
        runs,
        num_runs,
        shape if runs == "negative_binomial" else None,
        neighboring_relation=event.neighboring_relation
        if isinstance(event, selection.WorstOfDpEvent)
        else planned[0][1],
    )
    if runs != "fixed" and cost.selected > cost.composed:
        out["notes"].append(
            f"at this mean the random count costs more than composing {cost.num_runs} runs"
            f" ({cost.selected:.4g} > {cost.composed:.4g}): a fixed grid (runs='fixed') is cheaper"
        )
    out.update(
        {
            "single_run_epsilon": cost.single,
            "selected_epsilon": cost.selected,
            "composed_epsilon": cost.composed,
            "composed_runs": cost.num_runs,
            "delta": delta,
            "accountant": "rdp",
            "accounting": cost.accounting,
            "method": "fixed grid: composition"
            if runs == "fixed"
            else "RepeatAndSelectDpEvent (Papernot and Steinke 2022)",
        }
    )
    return out


RUN_EVENT = "run_event.pkl"
"""Each run's ``(event, relation)`` as its tracker composed it (pickled ``dp_accounting`` events),
kept beside the run so that a sweep read back from disk accounts its selection after the runs."""


class _KeepRunEvent(Callback):
    """At the end of a run, its tracker's composed event into ``run_dir/RUN_EVENT``."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, RUN_EVENT)

    def on_train_end(self, run):
        if run.tracker is None or not hosts.is_primary():
            return
        try:
            pair = (selection.run_event(run.tracker), selection.run_relation(run.tracker))
        except (TypeError, ValueError):  # a tracker whose run has no single event
            return
        with open(self.path, "wb") as f:
            pickle.dump(pair, f)


def _read_run_event(run_dir: str):
    path = os.path.join(run_dir, RUN_EVENT)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return pickle.load(f)


def _run_or_resume(experiment: Experiment, run_dir: str, options: dict) -> RunSummary:
    """The run's summary: read back where ``run_dir`` holds this config's finished run, the run
    resumed where it stopped part-way, else run from the start."""
    options = dict(options)
    options["callbacks"] = (*options.get("callbacks", ()), _KeepRunEvent(run_dir))
    overwrite = options.pop("overwrite", False)
    options.pop("resume", None)
    if not overwrite and os.path.exists(os.path.join(run_dir, "config.json")):
        config_json = experiment.config.copy_and_resolve_references().to_json_best_effort()
        results.check_resumable(run_dir, config_json, default_config().to_json_best_effort())
        finished = _finished(run_dir)
        if finished is not None:
            return finished
        return experiment.run(run_dir, resume=True, **options)
    return experiment.run(run_dir, overwrite=overwrite, **options)


def _run_fresh_together(experiments, run_dirs, options: dict) -> dict:
    """The summaries of the runs with nothing in their folders yet (or all, with ``overwrite``),
    trained as one vmapped program, by index; the others are left to ``_run_or_resume``."""
    fresh = [
        i
        for i, d in enumerate(run_dirs)
        if options.get("overwrite") or not os.path.exists(os.path.join(d, "config.json"))
    ]
    if len(fresh) < 2:
        return {}
    summaries = run_together(
        [experiments[i].config for i in fresh],
        [run_dirs[i] for i in fresh],
        "sweep",
        [[_KeepRunEvent(run_dirs[i])] for i in fresh],
        **options,
    )
    return dict(zip(fresh, summaries))


def _finished(run_dir: str) -> RunSummary | None:
    """The run's summary where ``run_dir`` holds a finished, uninterrupted one."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        saved = json.loads(f.read())
    fields = {f.name for f in dataclasses.fields(RunSummary)}
    summary = RunSummary(**{k: v for k, v in saved.items() if k in fields})
    return None if summary.interrupted else summary


def typed_values(cfg: ml_collections.ConfigDict, key: str, texts: list[str]) -> list:
    """The command line's text values of ``key`` as its default's type (int, float, bool, str); a
    ``ValueError`` naming the key and the value otherwise."""
    node = cfg
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            raise KeyError(configs.unknown_key_message(key, cfg))
        node = node[part]
    out = []
    for text in texts:
        if isinstance(node, bool):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{key} takes true or false, got {text!r}")
            out.append(text.lower() in ("true", "1"))
        elif isinstance(node, int):
            try:
                out.append(int(text))
            except ValueError:
                raise ValueError(f"{key} takes an integer, got {text!r}") from None
        elif isinstance(node, float):
            try:
                out.append(float(text))
            except ValueError:
                raise ValueError(f"{key} takes a number, got {text!r}") from None
        else:
            out.append(text)
    return out
