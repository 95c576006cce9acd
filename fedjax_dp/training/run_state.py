"""What the loop carries from round to round besides the server state, and its checkpoint.

A checkpoint holds the server state (with the upload transforms' state: adaptive clip norm,
compression reference), the per-client states of the clients that have one (the algorithm's, and the
upload chain's: error feedback's residuals), and a JSON record of the
host RNGs (not under ``privacy.secure_rng``: never written), counters, the best accuracy, traffic totals and the participation history. The privacy
tracker is rebuilt on resume by replaying the participations: never reset, never counted twice.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from fedjax_dp.compression.traffic import TrafficMeter
from fedjax_dp.core.client_states import ClientStateStore
from fedjax_dp.training.checkpointing import Checkpointer, truncate_metrics
from fedjax_dp.training.evaluation import headline_accuracy


@dataclasses.dataclass
class LoopState:
    sampling_rng: np.random.Generator  # which clients take part (core.rng.host_generators)
    shuffle_rng: np.random.Generator  # per-client batch shuffles
    secure_rng: bool = False  # OS-entropy generators: their states are never written to a checkpoint
    client_states: ClientStateStore | None = None  # per-client algorithm state (control variates, say)
    upload_client_states: ClientStateStore | None = None  # per-client upload-chain state (error feedback)
    client_updates: int = 0
    rounds_run: int = 0
    best: list = dataclasses.field(default_factory=lambda: [-1.0, -1])
    last_eval: dict = dataclasses.field(default_factory=dict)
    last_evaluation: object = None  # the last evaluation.Evaluation (not checkpointed: recomputed after a resume)
    last_evaluation_round: int = -1
    participation: list = dataclasses.field(default_factory=list)  # [round, client ids] per round run
    all_dropped_streak: int = 0  # consecutive rounds in which every client update was non-finite
    meter: TrafficMeter = dataclasses.field(default_factory=TrafficMeter)

    def _stores(self) -> dict:
        """Per-client stores: checkpoint tree name -> (the record's key of their client ids, the store)."""
        return {"client_states": ("client_state_ids", self.client_states),
                "upload_client_states": ("upload_client_state_ids", self.upload_client_states)}

    def save(self, checkpointer: Checkpointer, state) -> None:
        trees, ids = {"state": state}, {}
        for name, (ids_key, store) in self._stores().items():
            ids[ids_key], stacked = store.export() if store is not None else ([], None)
            if ids[ids_key]:
                trees[name] = stacked
        checkpointer.save(self.rounds_run, trees, {
            "host_rngs": None if self.secure_rng else [self.sampling_rng.bit_generator.state,
                                                       self.shuffle_rng.bit_generator.state],
            "client_updates": self.client_updates,
            "best": self.best, "last_eval": self.last_eval, "participation": self.participation,
            "uplink": self.meter.uplink, "downlink": self.meter.downlink, "all_dropped_streak": self.all_dropped_streak,
            **ids})

    def restore(self, checkpointer: Checkpointer, state, tracker, workdir: str):
        """Loads the newest checkpoint into this loop state; returns the server state."""
        def targets(saved):
            trees = {"state": state}
            for name, (ids_key, store) in self._stores().items():
                if saved.get(ids_key):
                    trees[name] = store.template_stack(len(saved[ids_key]))
            return trees

        restored = checkpointer.restore_latest(targets)
        if restored is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {checkpointer.directory}")
        trees, saved = restored
        for name, (ids_key, store) in self._stores().items():
            if store is not None:
                store.load(saved.get(ids_key, []), trees.get(name))
        self.rounds_run = saved["round"]
        if saved["host_rngs"] is not None:  # secure: the fresh OS-entropy generators go on
            self.sampling_rng.bit_generator.state, self.shuffle_rng.bit_generator.state = saved["host_rngs"]
        self.client_updates, self.best, self.last_eval = saved["client_updates"], saved["best"], saved["last_eval"]
        self.participation, self.all_dropped_streak = saved["participation"], saved["all_dropped_streak"]
        self.meter = TrafficMeter(saved["uplink"], saved["downlink"])
        if tracker is not None:
            for t, ids in self.participation:
                tracker.record(t, np.asarray(ids, dtype=np.int64))
        truncate_metrics(os.path.join(workdir, "metrics.jsonl"), self.rounds_run)
        return trees["state"]

    def evaluated(self, t: int, evaluation) -> None:
        """Records an ``evaluation.Evaluation`` of the state after round ``t``."""
        self.last_evaluation, self.last_evaluation_round = evaluation, t
        metrics = self.last_eval = evaluation.metrics
        if headline_accuracy(metrics) > self.best[0]:
            self.best = [headline_accuracy(metrics), t]
