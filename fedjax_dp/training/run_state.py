"""What the loop carries from round to round besides the server state, and its checkpoint.

A checkpoint holds the server state (with the upload transforms' state: adaptive clip norm,
compression reference), the per-client states of the clients that have one (the algorithm's, and the
upload chain's: error feedback's residuals), and a JSON record of the host RNGs (not under
``privacy.secure_rng``: never written), counters, the best accuracy, traffic totals, the
participation history, the run's resolved config and what the privacy tracker had composed
(``tracker.composed()``).

Resume refuses a checkpoint whose config differs from the run's (or that
holds
none: it cannot be verified), replays the participations into the tracker (never reset, never
counted twice) and refuses unless the replay composes exactly what the checkpoint says ran: a resume
never re-accounts the past at today's noise.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np

from fedjax_dp.compression.traffic import TrafficMeter
from fedjax_dp.core import hosts
from fedjax_dp.core.client_states import ClientStateStore
from fedjax_dp.training.checkpointing import Checkpointer, truncate_metrics
from fedjax_dp.training.evaluation import headline_accuracy
from fedjax_dp.training.results import config_differences


@dataclasses.dataclass
class LoopState:
    sampling_rng: np.random.Generator  # which clients take part (core.rng.host_generators)
    shuffle_rng: np.random.Generator  # per-client batch shuffles
    # OS-entropy generators: their states are never written to a checkpoint
    secure_rng: bool = False
    # per-client algorithm state (control variates, say)
    client_states: ClientStateStore | None = None
    # per-client upload-chain state (error feedback)
    upload_client_states: ClientStateStore | None = None
    client_updates: int = 0
    rounds_run: int = 0
    best: list = dataclasses.field(default_factory=lambda: [-1.0, -1])
    last_eval: dict = dataclasses.field(default_factory=dict)
    # the last evaluation.Evaluation (not checkpointed: recomputed after a resume)
    last_evaluation: object = None
    last_evaluation_round: int = -1
    # [round, client ids] per round run
    participation: list = dataclasses.field(default_factory=list)
    all_dropped_streak: int = 0  # consecutive rounds in which every client update was non-finite
    meter: TrafficMeter = dataclasses.field(default_factory=TrafficMeter)
    # the run's resolved config: saved with every checkpoint, a resume must match it
    config: dict | None = None
    earlier_seconds: float = 0.0  # the run's time before this process (segments before a resume)
    # the divergence monitor's state (``divergence.DivergenceMonitor``)
    divergence: dict | None = None
    # rounds this process saved or restored
    checkpointed: set = dataclasses.field(default_factory=set)
    # the canaries' own model beside the run's (``audit.side_by_side``), checkpointed with it
    audit_state: object = None

    def _stores(self) -> dict:
        """Per-client stores: checkpoint tree name -> (the record's key of their client ids, the
        store)."""
        return {
            "client_states": ("client_state_ids", self.client_states),
            "upload_client_states": ("upload_client_state_ids", self.upload_client_states),
        }

    def save(self, checkpointer: Checkpointer, state, tracker=None, seconds: float = 0.0) -> None:
        """Checkpoints the state after ``rounds_run`` (once: a round this process saved or restored
        is not saved again); ``seconds``: this process's time so far."""
        if self.rounds_run in self.checkpointed:
            return
        trees, ids = {"state": state}, {}
        if self.audit_state is not None:
            trees["audit_state"] = self.audit_state
        for name, (ids_key, store) in self._stores().items():
            ids[ids_key], stacked = store.export() if store is not None else ([], None)
            if ids[ids_key]:
                trees[name] = stacked
        checkpointer.save(
            self.rounds_run,
            trees,
            {
                "host_rngs": (
                    None
                    if self.secure_rng
                    else [
                        self.sampling_rng.bit_generator.state,
                        self.shuffle_rng.bit_generator.state,
                    ]
                ),
                "client_updates": self.client_updates,
                "best": self.best,
                "last_eval": self.last_eval,
                "participation": self.participation,
                "uplink": self.meter.uplink,
                "downlink": self.meter.downlink,
                "all_dropped_streak": self.all_dropped_streak,
                "config": self.config,
                "privacy": tracker.composed() if tracker is not None else None,
                "seconds": self.earlier_seconds + seconds,
                "divergence": self.divergence,
                "processes": hosts.process_count(),
                **ids,
            },
        )
        self.checkpointed.add(self.rounds_run)

    def restore(
        self,
        checkpointer: Checkpointer,
        state,
        tracker,
        workdir: str,
        defaults: dict | None = None,
        releases_for=lambda t: [],
    ):
        """Loads the newest intact checkpoint into this loop state; returns the server state.
        Refuses one whose config is not this run's (``defaults``: keys added to the library since,
        at their defaults, are no difference) or whose privacy history the replay does not reproduce
        (module docstring); ``releases_for(t)``: round t's releases, which the replay composes."""

        def targets(saved):
            trees = {"state": state}
            if self.audit_state is not None:
                trees["audit_state"] = self.audit_state
            for name, (ids_key, store) in self._stores().items():
                if saved.get(ids_key):
                    trees[name] = store.template_stack(len(saved[ids_key]))
            return trees

        restored = checkpointer.restore_latest(targets)
        if restored is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {checkpointer.directory}")
        trees, saved = restored
        where = checkpointer.path(saved["round"])
        if saved.get("config") is None:
            raise ValueError(
                f"cannot resume from {where}: it holds no config (written before checkpoints"
                " carried one), so what produced it cannot be verified; start the run again with"
                " --overwrite"
            )
        differences = config_differences(saved["config"], self.config, defaults or {})
        if differences:
            raise ValueError(
                f"cannot resume from {where}: it was written by another config: "
                + "; ".join(differences[:8])
                + (" ..." if len(differences) > 8 else "")
            )
        for name, (ids_key, store) in self._stores().items():
            if store is not None:
                store.load(saved.get(ids_key, []), trees.get(name))
        self.rounds_run = saved["round"]
        if saved.get("processes", 1) != hosts.process_count():
            logging.warning(
                "resuming %s, written by %d process(es), on %d: the cohort is re-sharded (the same"
                " clients, keys and noise; the cross-host sums may differ in their last bits)",
                where,
                saved.get("processes", 1),
                hosts.process_count(),
            )
        if saved["host_rngs"] is not None:  # secure: the fresh OS-entropy generators go on
            self.sampling_rng.bit_generator.state, self.shuffle_rng.bit_generator.state = saved[
                "host_rngs"
            ]
        self.client_updates, self.best, self.last_eval = (
            saved["client_updates"],
            saved["best"],
            saved["last_eval"],
        )
        self.participation, self.all_dropped_streak = (
            saved["participation"],
            saved["all_dropped_streak"],
        )
        self.meter = TrafficMeter(saved["uplink"], saved["downlink"])
        self.earlier_seconds, self.divergence = saved.get("seconds", 0.0), saved.get("divergence")
        if tracker is not None:
            for t, ids in self.participation:
                tracker.record(t, np.asarray(ids, dtype=np.int64), releases_for(t))
            mismatch = _composition_mismatch(saved.get("privacy"), tracker.composed())
            if mismatch:
                raise ValueError(
                    f"cannot resume from {where}: replaying its {len(self.participation)} rounds"
                    f" does not compose what ran ({mismatch}); the epsilon would not be the model's"
                )
        self.checkpointed.add(self.rounds_run)
        hosts.on_primary(truncate_metrics, os.path.join(workdir, "metrics.jsonl"), self.rounds_run)
        if self.audit_state is not None:
            self.audit_state = trees["audit_state"]
        return trees["state"]

    def seconds_total(self, seconds: float) -> float:
        """The run's time: the segments before this process and ``seconds`` of this one."""
        return self.earlier_seconds + seconds

    def evaluated(self, t: int, evaluation) -> None:
        """Records an ``evaluation.Evaluation`` of the state after round ``t``."""
        self.last_evaluation, self.last_evaluation_round = evaluation, t
        metrics = self.last_eval = evaluation.metrics
        if headline_accuracy(metrics) > self.best[0]:
            self.best = [headline_accuracy(metrics), t]


def _composition_mismatch(saved: dict | None, replayed: dict) -> str:
    """What differs between the privacy composition a checkpoint recorded and its replay ('' if
    nothing)."""
    if saved is None:
        return "the checkpoint records no privacy composition"
    for key in sorted(set(saved) | set(replayed)):
        a, b = saved.get(key), replayed.get(key)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            same = len(a) == len(b) and np.allclose(
                np.asarray(a, float), np.asarray(b, float), rtol=1e-9, atol=0
            )
        elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
            same = a == b or bool(np.isclose(a, b, rtol=1e-9, atol=0))
        else:
            same = a == b
        if not same:
            return f"{key}: recorded {_short(a)}, replayed {_short(b)}"
    return ""


def _short(value) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."
