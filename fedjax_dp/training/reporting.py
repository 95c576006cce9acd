"""The end of a run: its summary (``summary.json``, the printed table) and ``privacy.json``."""

from __future__ import annotations

import dataclasses
import math

from fedjax_dp.privacy.mechanisms.gaussian import NOISE_DRAWS
from fedjax_dp.training.evaluation import headline_accuracy


@dataclasses.dataclass
class RunSummary:
    """What a run ends with (``summary.json``; ``format()`` is the table the CLI prints).

    ``final``: the last evaluation's metrics: ``test_accuracy`` and ``test_loss`` on the central
    test set and ``client_accuracy`` (the mean over clients of the global model's accuracy on each
    client's own test data) for a global classifier; ``personalized_accuracy`` with ``_std``,
    ``_min``, ``_p10``, ``_p50``, ``_p90`` and ``personalized_unseen_fraction`` for a personalised
    algorithm (or with ``eval_prototypes``); ``validation_accuracy`` on a server-held validation set
    where the algorithm has one. ``client_updates``: the number of client updates the run used
    (Geyer et al.'s communication cost CC).
    """

    workdir: str
    rounds: int
    final: dict
    best_accuracy: float
    best_round: int
    client_updates: int
    seconds: float
    dropped_updates: int = 0  # client updates kept out of the model as non-finite, all rounds
    epsilon: float | None = None
    # whether a DP proof covers that epsilon (False: a figure, no guarantee)
    formal: bool | None = None
    delta: float | None = None  # the delta that epsilon is at
    # what the noise was calibrated to, where it was (``privacy.target_epsilon``)
    calibration: str = ""
    stopped_early: bool = False
    uplink_gb: float = 0.0  # bytes actually sent by clients (compression.traffic), all rounds
    traffic_gb: float = 0.0  # uplink + downlink
    stop_reason: str | None = None  # privacy budget, divergence, or an interrupting signal
    # stopped by SIGINT / SIGTERM: resume with ``resume=True`` / ``--resume``
    interrupted: bool = False
    # stopped because the training diverged (``training.divergence``; the CLI exits 3)
    diverged: bool = False
    # ``seconds`` plus the segments before a resume (``seconds``: this process only)
    seconds_total: float = 0.0
    # the canaries' figures (``audit.canaries``): per threat model epsilon-hat, its interval and
    # the one-run lower bound; an estimate, never a guarantee (``empirical_brief``)
    empirical: dict | None = None

    def format(self) -> str:
        """The table the CLI prints (``format_summary``)."""
        return format_summary(self)


OUTSIDE_GUARANTEE = {
    "train_loss": "mean training loss of the cohort, from raw client data",
    "train_data_loss": (
        "the same loss without the local objective's regulariser, from raw client data"
    ),
    "clipped_fraction": "fraction of clients clipped, from raw update norms",
    "median_update_norm": "median of the raw update norms",
    "mean_update_norm": "mean of the update norms",
    "between_client_variance": "Geyer's V_c, from raw updates",
    "update_scale": "Geyer's U_s, from raw updates",
    "cohort_size": (
        "the realised cohort size (under Poisson sampling it reveals participation counts)"
    ),
    "dropped_client_ids": "ids of clients whose update was non-finite (a data-dependent event)",
    "dropped_clients": "the number of dropped clients",
    "client_accuracy": (
        "mean over clients of the global model's accuracy on each client's own test data"
    ),
    "personalized_": (
        "each client's personalised model (built from its own training data) scored on its own test"
        " data: the mean, spread and quantiles over clients, and the share of unseen test labels"
    ),
}
"""Statistics a run may publish beside its epsilon that no DP mechanism covers: a key, or a prefix
ending in ``_`` for a family. ``eval_client_data=False`` keeps every evaluation on client data out
of a run (the global model is then scored on the central, server-held test set only)."""
CLIENT_TEST_SET = {
    "test_accuracy": (
        "accuracy on the central test set, which is the union of the clients' own test "
        "data (the source has no test split)"
    ),
    "test_loss": "loss on that central test set (the clients' own test data)",
}
CLIENT_ACCURACIES_FILE = (
    "client_accuracies.json: each client's final accuracy on its own test data, one value per "
    "client"
)


def outside_guarantee(rows, client_test_set: bool, wrote_client_accuracies: bool) -> list[str]:
    """Every published value computed from client data that no mechanism covers
    (``OUTSIDE_GUARANTEE``); ``client_test_set``: the central test set is the clients' own test
    data."""
    published = {key for row in rows for key in row}
    listed = dict(OUTSIDE_GUARANTEE, **(CLIENT_TEST_SET if client_test_set else {}))
    found = [
        f"{key.rstrip('_') + '*' if key.endswith('_') else key}: {why}"
        for key, why in listed.items()
        if (
            key in published if not key.endswith("_") else any(k.startswith(key) for k in published)
        )
    ]
    return found + ([CLIENT_ACCURACIES_FILE] if wrote_client_accuracies else [])


SEEDED_RNG = (
    "seeded: the noise, sampling and shuffles are reproducible from config.json's seed (a"
    " simulation; set privacy.secure_rng=True for OS entropy)"
)
SECURE_RNG = (
    "secure: noise, client sampling and batch shuffles from OS entropy, never written; noise is a"
    f" sum of {NOISE_DRAWS} float32 normal draws (privacy.mechanisms.gaussian); residual: float32"
    " rounding of the noised values (no discrete Gaussian); rounds re-run after a resume draw"
    " fresh noise"
)


def privacy_record(
    tracker,
    notes: list[str],
    rows: list[dict] = (),
    breaches: list[str] = (),
    secure_rng: bool = False,
    client_test_set: bool = False,
    wrote_client_accuracies: bool = False,
    privacy_unit: str | None = None,
) -> dict:
    """What ``privacy.json`` holds: the tracker's report (strict JSON; what the run published
    outside the guarantee listed; ``formal`` false with each reason in ``breaches``), or for a run
    that released nothing private an unbounded epsilon. ``privacy_unit``: who a client is, where
    the data source says (your own clients: the ids you gave)."""
    unit = {} if privacy_unit is None else {"privacy_unit": privacy_unit}
    if tracker is None:
        return {
            "mechanism": "none",
            "epsilon": None,
            "epsilon_unbounded": True,
            "formal": False,
            "notes": (
                ["no upload transform adds noise: no differential privacy (epsilon unbounded)"]
                + notes
            ),
            **unit,
        }
    record = _strict(dataclasses.asdict(tracker.report()))
    record["noise_rng"] = "secure" if secure_rng else "seeded"
    record["notes"] = record["notes"] + [SECURE_RNG if secure_rng else SEEDED_RNG] + notes
    if breaches:
        record["formal"] = False
        record["notes"] += [f"NO formal guarantee: {reason}" for reason in breaches]
    record["outside_guarantee"] = outside_guarantee(rows, client_test_set, wrote_client_accuracies)
    return {**record, **unit}


def _strict(value):
    """Strict JSON: a non-finite number (an unbounded epsilon) becomes null, flagged beside it."""
    if isinstance(value, dict):
        out = {k: _strict(v) for k, v in value.items()}
        out.update(
            {
                f"{k}_unbounded": True
                for k, v in value.items()
                if isinstance(v, float) and not math.isfinite(v)
            }
        )
        return out
    if isinstance(value, list):
        return [_strict(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def format_summary(summary: RunSummary) -> str:
    """The table printed at the end of a run (keys padded to the longest, so none runs into its
    value)."""
    width = max([22] + [len("final " + k) + 2 for k in summary.final])
    lines = [
        f"{'workdir':<{width}}{summary.workdir}",
        f"{'rounds':<{width}}{summary.rounds}"
        + (f"  (stopped: {summary.stop_reason})" if summary.stop_reason else ""),
        (
            f"{'client updates (CC)':<{width}}{summary.client_updates} (communication cost: updates"
            " sent)"
        ),
    ]
    if summary.dropped_updates:
        lines.append(
            f"{'dropped updates':<{width}}{summary.dropped_updates} of {summary.client_updates} "
            "(non-finite, kept out of the model)"
        )
    lines += [
        f"{'best accuracy':<{width}}{summary.best_accuracy:.4f} (round {summary.best_round})",
        f"{'traffic (GB)':<{width}}{summary.uplink_gb:.4f} up, {summary.traffic_gb:.4f} total",
    ]
    lines += [f"{'final ' + k:<{width}}{v:.4f}" for k, v in summary.final.items()]
    if summary.epsilon is not None:
        at = f" at delta {summary.delta:g}" if summary.delta is not None else ""
        lines.append(
            f"{'epsilon spent':<{width}}{summary.epsilon:.4f}{at}"
            + (
                "  (formal: false: NO differential-privacy guarantee, see privacy.json)"
                if summary.formal is False
                else "  (formal: true)"
            )
        )
        if summary.calibration:
            lines.append(f"{'calibrated':<{width}}{summary.calibration}")
    for threat_model, figure in (summary.empirical or {}).get("threat_models", {}).items():
        low, high = figure["interval"]
        flag = "; FLAGGED: above the formal epsilon" if figure["flagged"] else ""
        lines.append(
            f"{'estimate, ' + threat_model.replace('_', ' '):<{width}}epsilon-hat"
            f" {figure['epsilon_hat']:.3g} [{low:.3g}, {high:.3g}], one-run lower bound"
            f" {figure['lower_bound']:.3g} ({summary.empirical['canaries']} canaries; an estimate,"
            f" NOT a guarantee{flag})"
        )
    lines.append(f"{'wall time':<{width}}{summary.seconds:.1f} s")
    return "\n".join(lines)


def empirical_brief(record: dict | None) -> dict | None:
    """The summary's digest of ``privacy.json``'s ``empirical`` record: the canaries and, per threat
    model, epsilon-hat, its interval, the one-run lower bound and whether it contradicts the formal
    epsilon (None without canaries, or when the audit failed)."""
    if not record or "error" in record:
        return None
    models = ("final_model", "all_iterates")
    return {
        "kind": record["kind"],
        "canaries": record["canaries"],
        "threat_models": {
            name: {
                key: record[name][key]
                for key in ("epsilon_hat", "interval", "lower_bound", "formal_epsilon", "flagged")
            }
            for name in models
            if name in record
        },
    }


def progress_postfix(evaluation: dict, row: dict, tracker) -> dict:
    """What the progress bar shows after an evaluation: accuracy, loss, epsilon spent."""
    postfix = {
        "acc": f"{headline_accuracy(evaluation):.4f}",
        "loss": f"{row.get('train_loss', float('nan')):.4f}",
    }
    if tracker is not None:
        postfix["eps"] = f"{row['epsilon']:.3f}" + (
            "" if row.get("formal", True) else " (formal: false)"
        )
    return postfix


def cohort_text(s) -> str:
    """How a config's ``sampling`` section draws the cohort, in a figure title's words: m (uniform),
    Poisson q (or its schedule), or the participation scheme with its b, k and check-in rate."""
    if s.method == "uniform":
        return f"m={s.cohort_size}"
    if s.method == "poisson":
        return (
            f"Poisson q_t={s.rate_schedule}"
            if s.get("rate_schedule", "")
            else f"Poisson q={s.rate:g}"
        )
    check_in = f", check-in {s.check_in_rate:g}" if s.check_in_rate < 1 else ""
    if s.method == "min_separation":
        k = f", k={s.max_participations}" if s.max_participations else ""
        return f"m={s.cohort_size}, b={s.min_separation} min-separation{k}{check_in}"
    if s.method == "single":
        return f"m={s.cohort_size}, single participation{check_in}"
    if s.method == "cyclic":
        return f"cyclic, {s.min_separation} groups"
    return f"cyclic Poisson, {s.min_separation} groups, q={s.rate:g}"


def run_title(cfg, dataset_name: str, num_clients: int, report=None) -> str:
    """A figure title naming the setting and its privacy parameters: algorithm, model, data, K, the
    cohort (``cohort_text``), E and B, and with privacy z, S, epsilon, delta and the
    accountant."""
    title = (
        f"{cfg.algorithm}: {cfg.model.name} on {dataset_name}, K={num_clients},"
        f" {cohort_text(cfg.sampling)}, "
        f"E={cfg.client.epochs}, B={cfg.client.batch_size}"
    )
    if report is None:
        return title + "; no DP (epsilon unbounded)"
    z = ",".join(f"{v:.3g}" for v in report.noise_multipliers[:3]) or "?"
    epsilon = (
        "unbounded"
        if report.epsilon is None or not math.isfinite(report.epsilon)
        else f"{report.epsilon:.3g}"
    )
    # the clip the noise is calibrated to, as it ran
    bounds = sorted(
        {
            r["bound_value"]
            for r in report.releases
            if r.get("noise_multiplier")
            and r.get("bound_value") is not None
            and math.isfinite(r["bound_value"])
            and r.get("unit", "client") == "client"
        }
    )
    clip = f", S={','.join(f'{b:.3g}' for b in bounds[:3])}" if bounds else ""
    return (
        title
        + f"\n{report.noise_mode} DP: z={z}{clip}, epsilon={epsilon} at delta={report.delta:g} "
        f"({report.accountant})" + ("" if report.formal else ", formal: false (NO guarantee)")
    )
