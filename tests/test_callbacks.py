"""The loop's hooks (issue 73, item 6): a user's callback from Python sees every round's row (and
can add to it) and stops the run on a metric; the default callbacks keep the results a plain run
writes."""

from __future__ import annotations

import json

import fedjax_dp
from fedjax_dp.training.callbacks import Callback, StopWhen


class Recorder(Callback):
    """A user's own tracker: every row it is given, and the run's end."""

    def __init__(self):
        self.rows, self.began, self.ended = [], False, False

    def on_train_begin(self, run):
        self.began = run.cfg.algorithm == "fedavg"

    def after_round(self, run, t, row):
        row["my_metric"] = 2.0 * t  # written with the row
        self.rows.append(dict(row))

    def on_train_end(self, run):
        self.ended = True


def _experiment():
    return fedjax_dp.Experiment(
        "fedavg_mnist",
        {
            "rounds": 12,
            "eval_every": 1,
            "model.name": "logistic",
            "sampling.cohort_size": 5,
            "client.epochs": 1,
        },
    )


def test_a_users_callback_sees_each_row_adds_to_it_and_stops_the_run_on_a_metric(tmp_path):
    recorder = Recorder()
    summary = _experiment().run(
        str(tmp_path / "run"),
        progress=False,
        callbacks=[recorder, StopWhen("test_accuracy", at_least=0.3)],
    )
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")][1:]
    assert (
        recorder.began
        and recorder.ended
        and [r["round"] for r in recorder.rows] == [r["round"] for r in rows]
    )
    assert all(r["my_metric"] == 2.0 * r["round"] for r in rows)
    reached = [r["round"] for r in rows if r["test_accuracy"] >= 0.3]
    assert summary.rounds == reached[0] < 12 and "test_accuracy" in summary.stop_reason
    assert "StopWhen" in json.load(open(tmp_path / "run" / "summary.json"))["stop_reason"]
    assert (
        sorted((tmp_path / "run" / "checkpoints").iterdir())[-1].name == f"round_{reached[0]:06d}"
    )
