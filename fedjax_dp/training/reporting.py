"""The end of a run: its summary (``summary.json``, the printed table) and ``privacy.json``."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class RunSummary:
    workdir: str
    rounds: int
    final: dict
    best_accuracy: float
    best_round: int
    client_updates: int
    seconds: float
    epsilon: float | None = None
    stopped_early: bool = False
    uplink_gb: float = 0.0  # bytes actually sent by clients (compression.traffic), all rounds
    traffic_gb: float = 0.0  # uplink + downlink
    stop_reason: str | None = None  # privacy budget, divergence, or an interrupting signal
    interrupted: bool = False  # stopped by SIGINT / SIGTERM: resume with ``resume=True`` / ``--resume``


def privacy_record(tracker, notes: list[str]) -> dict:
    """What ``privacy.json`` holds: the tracker's report, or for a run that released nothing private
    an explicit epsilon of infinity (every run records what it spent)."""
    if tracker is None:
        return {"mechanism": "none", "epsilon": None, "epsilon_unbounded": True, "formal": False,
                "notes": ["no upload transform adds noise: no differential privacy (epsilon unbounded)"] + notes}
    record = _strict(dataclasses.asdict(tracker.report()))
    record["notes"] = record["notes"] + notes
    return record


def _strict(value):
    """Strict JSON: a non-finite number (an unbounded epsilon) becomes null, flagged beside it."""
    if isinstance(value, dict):
        out = {k: _strict(v) for k, v in value.items()}
        out.update({f"{k}_unbounded": True for k, v in value.items() if isinstance(v, float) and not math.isfinite(v)})
        return out
    if isinstance(value, list):
        return [_strict(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def format_summary(summary: RunSummary) -> str:
    """The table printed at the end of a run."""
    lines = [
        f"{'workdir':<22}{summary.workdir}",
        f"{'rounds':<22}{summary.rounds}" + (f"  (stopped: {summary.stop_reason})" if summary.stop_reason else ""),
        f"{'client updates (CC)':<22}{summary.client_updates}",
        f"{'best accuracy':<22}{summary.best_accuracy:.4f} (round {summary.best_round})",
        f"{'traffic (GB)':<22}{summary.uplink_gb:.4f} up, {summary.traffic_gb:.4f} total",
    ]
    lines += [f"{'final ' + k:<22}{v:.4f}" for k, v in summary.final.items()]
    if summary.epsilon is not None:
        lines.append(f"{'epsilon spent':<22}{summary.epsilon:.4f}")
    lines.append(f"{'wall time':<22}{summary.seconds:.1f} s")
    return "\n".join(lines)


def progress_postfix(evaluation: dict, row: dict, tracker) -> dict:
    """What the progress bar shows after an evaluation: accuracy, loss, epsilon spent."""
    postfix = {"acc": f"{evaluation['test_accuracy']:.4f}", "loss": f"{row.get('train_loss', float('nan')):.4f}"}
    if tracker is not None:
        postfix["eps"] = f"{row['epsilon']:.3f}"
    return postfix
