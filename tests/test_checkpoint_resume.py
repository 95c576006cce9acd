"""Checkpoint and resume: an interrupted (or killed) and resumed run equals an uninterrupted one,
and its privacy ledger is neither reset nor double counted; a diverged model stops the run."""

import json
import os
import shutil
import signal

import numpy as np
import pytest
from conftest import sigint_at_round

import fedjax_dp.training.loop as loop_module
import fedjax_dp.training.run_context as run_context
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment


def _config(algorithm="dp_fedavg"):
    c = default_config()
    c.rounds, c.eval_every, c.checkpoint_every = 6, 2, 2
    c.data.num_clients = 20
    c.client.update(epochs=1, batch_size=20)
    c.sampling.cohort_size = 4
    if algorithm == "dp_fedavg":
        c.dp.noise_multiplier = 0.8
    c.algorithm = algorithm
    return c


def _files(workdir):
    with open(os.path.join(workdir, "metrics.jsonl"), "rb") as f:
        metrics = f.read()
    with open(os.path.join(workdir, "privacy.json")) as f:
        return metrics, json.load(f)


def test_interrupted_and_killed_runs_resume_to_the_uninterrupted_result(tmp_path, monkeypatch):
    reference = run_experiment(_config(), str(tmp_path / "a"), progress=False)
    want_metrics, want_privacy = _files(tmp_path / "a")

    with monkeypatch.context() as m:  # SIGINT in round 3: checkpoint at 3, stop
        sigint_at_round(m, 3)
        stopped = run_experiment(_config(), str(tmp_path / "b"), progress=False)
    assert stopped.interrupted and stopped.rounds == 3 and "SIGINT" in stopped.stop_reason
    with pytest.raises(FileExistsError):  # never overwritten without a flag
        run_experiment(_config(), str(tmp_path / "b"), progress=False)
    resumed = run_experiment(_config(), str(tmp_path / "b"), progress=False, resume=True)
    assert resumed.rounds == 6 and not resumed.interrupted
    assert _files(tmp_path / "b") == (want_metrics, want_privacy)
    assert resumed.epsilon == reference.epsilon and resumed.best_accuracy == reference.best_accuracy

    with monkeypatch.context() as m:  # "killed" after round 5: its checkpoint never got written
        sigint_at_round(m, 5)
        run_experiment(_config(), str(tmp_path / "c"), progress=False)
    checkpoints = tmp_path / "c" / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["round_000004", "round_000005"]  # the last two kept
    shutil.rmtree(checkpoints / "round_000005")
    # drops row 5, reruns 5-6
    run_experiment(_config(), str(tmp_path / "c"), progress=False, resume=True)
    assert _files(tmp_path / "c") == (want_metrics, want_privacy)


def test_checkpoint_keep_zero_keeps_every_round_and_a_negative_count_is_refused(tmp_path):
    c = _config("fedavg")
    c.rounds, c.checkpoint_every, c.checkpoint_keep = 4, 1, 0
    run_experiment(c, str(tmp_path / "all"), progress=False)
    assert sorted(os.listdir(tmp_path / "all" / "checkpoints")) == [
        f"round_00000{t}" for t in (1, 2, 3, 4)
    ]
    c.checkpoint_keep = 3
    run_experiment(c, str(tmp_path / "three"), progress=False)
    assert sorted(os.listdir(tmp_path / "three" / "checkpoints")) == [
        f"round_00000{t}" for t in (2, 3, 4)
    ]
    c.checkpoint_keep = -1
    with pytest.raises(ValueError, match="checkpoint_keep must be >= 0 .*got -1"):
        run_experiment(c, str(tmp_path / "bad"), progress=False)
    assert not (tmp_path / "bad").exists()


def test_resume_needs_a_checkpoint_and_the_same_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run_experiment(_config(), str(tmp_path / "none"), progress=False, resume=True)
    c = _config()
    c.rounds = 2
    run_experiment(c, str(tmp_path / "d"), progress=False)
    c.client.learning_rate = 0.5
    with pytest.raises(
        ValueError, match="config.json differs .*client.learning_rate: saved 0.05, now 0.5"
    ):
        run_experiment(c, str(tmp_path / "d"), progress=False, resume=True)


def test_a_resume_with_another_config_is_refused_before_data_or_checkpoint_is_read(
    tmp_path, monkeypatch
):
    """Bug (found 2026-11-29 by a new-user trial): ``--resume`` of a FedAvg workdir with a DP-FedAvg
    config failed inside orbax's restore (a page of "Source: <class 'list'> / Target:
    ...ValueMetadataEntry"), because the config was compared only after the data was loaded and the
    checkpoint read."""
    c = _config("fedavg")
    c.rounds = 2
    run_experiment(c, str(tmp_path / "d"), progress=False)
    monkeypatch.setattr(run_context, "build_dataset", lambda *a: pytest.fail("data was loaded"))
    with pytest.raises(
        ValueError, match="config.json differs .*algorithm: saved 'fedavg', now 'dp_fedavg'"
    ):
        run_experiment(_config("dp_fedavg"), str(tmp_path / "d"), progress=False, resume=True)


def test_a_run_from_before_a_config_key_existed_resumes_while_the_key_keeps_its_default(tmp_path):
    """Bug: a Table 7 run checkpointed before ``compression.refresh`` and ``error_feedback`` were
    added could not be resumed after (its config.json lacked them: "config.json differs"). A key the
    saved config lacks now counts as the same when this run leaves it at its default; set to
    anything else, it is named."""
    c = _config()
    c.rounds = 4
    with pytest.MonkeyPatch.context() as m:  # SIGINT in round 2: checkpoint at 2, stop
        sigint_at_round(m, 2)
        run_experiment(c, str(tmp_path / "old"), progress=False)
    path = tmp_path / "old" / "config.json"
    saved = json.loads(path.read_text())
    # as an older version wrote it
    del saved["compression"]["refresh"], saved["compression"]["error_feedback"]
    path.write_text(json.dumps(saved))
    changed = _config()
    changed.rounds = 4
    changed.compression.refresh = "round"
    with pytest.raises(ValueError, match=r"compression.refresh: saved \(absent\), now 'round'"):
        run_experiment(changed, str(tmp_path / "old"), progress=False, resume=True)
    assert run_experiment(c, str(tmp_path / "old"), progress=False, resume=True).rounds == 4


def test_a_diverged_model_stops_the_run_with_a_clear_reason(tmp_path):
    c = _config("fedavg")
    c.rounds = 8
    # the first server step overflows float32: the parameters become inf
    c.server.learning_rate = 1e39
    summary = run_experiment(c, str(tmp_path), progress=False)
    assert summary.stop_reason == "the global model diverged in round 1 (non-finite parameters)"
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")][1:]  # [0]: round 0
    assert rows[-1]["diverged"] is True and summary.rounds == 0


def test_divergence_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    calls = []

    class DivergesInRound3:
        def __getattr__(self, name):
            return getattr(loop_module.tree_module, name)

        @staticmethod
        def is_finite(params):
            calls.append(1)
            return len(calls) < 3

    monkeypatch.setattr(loop_module, "tree_module", run_context.tree, raising=False)
    monkeypatch.setattr(run_context, "tree", DivergesInRound3())
    c = _config("fedavg")
    summary = run_experiment(c, str(tmp_path), progress=False)
    assert summary.rounds == 2 and "round 3" in summary.stop_reason
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["round_000002"]


def test_a_non_finite_client_update_is_dropped_and_named_with_its_client_id(tmp_path, monkeypatch):
    real_pack = run_context.make_packer

    def poisoning_packer(cfg, dataset, algorithm):
        pack = real_pack(cfg, dataset, algorithm)

        def poisoned(ids, rng, slots):
            cohort = pack(ids, rng, slots)
            cohort["batches"]["x"] = cohort["batches"]["x"].copy()
            cohort["batches"]["x"][poison] = np.nan  # these sampled clients' data is corrupt
            return cohort

        return poisoned

    poison = [1]
    monkeypatch.setattr(run_context, "make_packer", poisoning_packer)
    c = _config("fedavg")
    c.rounds = 2
    summary = run_experiment(c, str(tmp_path), progress=False)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")][1:]  # [0]: round 0
    assert all(r["dropped_clients"] == 1 and len(r["dropped_client_ids"]) == 1 for r in rows)
    assert summary.stop_reason is None and np.isfinite(summary.final["test_loss"])
    # the summary says how many updates never reached the model: a run that lost most of its updates
    # without three all-dropped rounds in a row still finishes, and its final accuracy must not read
    # as clean
    assert (summary.dropped_updates, summary.client_updates) == (2, 8)
    assert json.load(open(tmp_path / "summary.json"))["dropped_updates"] == 2
    assert "2 of 8 (non-finite, kept out of the model)" in summary.format()

    poison[:] = [0, 1, 2, 3]  # every client, every round: the run stops after STALL_ROUNDS rounds
    c.rounds = 8
    summary = run_experiment(c, str(tmp_path / "stalled"), progress=False)
    assert (
        summary.rounds == run_context.STALL_ROUNDS
        and "non-finite for 3 rounds" in summary.stop_reason
    )


def _cli(workdir, *extra):
    import subprocess
    import sys

    config = "fedavg_mnist"
    args = [
        sys.executable,
        "-m",
        "fedjax_dp.cli",
        f"--config={config}",
        f"--workdir={workdir}",
        "--noprogress",
        "--config.algorithm=dp_fedavg",
        "--config.rounds=30",
        "--config.eval_every=5",
        "--config.checkpoint_every=1",
        "--config.data.num_clients=20",
        "--config.client.epochs=1",
        "--config.client.batch_size=20",
        "--config.sampling.cohort_size=4",
        "--config.dp.noise_multiplier=0.8",
        *extra,
    ]
    log = open(f"{workdir}.log", "a")  # a file, not a pipe: a full pipe would block the child
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_a_process_killed_with_sigkill_resumes_to_the_uninterrupted_result(tmp_path):
    """The real thing: a separate process is SIGKILLed mid-run (no handler runs, a metrics row may
    be torn); ``--resume`` in a new process ends with metrics and privacy ledger identical to an
    uninterrupted run."""
    import time

    reference = _cli(tmp_path / "a")
    assert reference.wait(timeout=600) == 0, open(f"{tmp_path / 'a'}.log").read()[-2000:]
    victim = _cli(tmp_path / "b")
    # orbax renames it into place when complete
    marker = tmp_path / "b" / "checkpoints" / "round_000003"
    deadline = time.time() + 600
    while not marker.exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    victim.kill()
    assert victim.wait(timeout=60) == -signal.SIGKILL, "the run ended before it could be killed"
    with open(tmp_path / "b" / "metrics.jsonl") as f:
        assert 0 < len(f.read().splitlines()) < 30  # it really stopped part-way
    resumed = _cli(tmp_path / "b", "--resume")
    assert resumed.wait(timeout=600) == 0, open(f"{tmp_path / 'b'}.log").read()[-2000:]
    assert _files(tmp_path / "b") == _files(tmp_path / "a")


def test_a_torn_last_metrics_row_is_dropped_but_a_corrupt_middle_row_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1}\n{"round": 2}\n{"round": 3, "test_acc')
    loop_module.truncate_metrics(str(path), 2)
    assert path.read_text() == '{"round": 1}\n{"round": 2}\n'
    path.write_text('{"round": 1}\n{"rou\n{"round": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not a JSON row"):
        loop_module.truncate_metrics(str(path), 3)
