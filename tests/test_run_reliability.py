"""What a reliability trial did to the CLI and the loop (issue 74, items 9-17): run, kill -9,
--overwrite, --resume, a lost config.json, damaged checkpoints, a full disk, two runs in one
workdir, SIGINT, diverging training, an infinite clip. No sequence reports less epsilon than the
mechanisms that produced the model
spent: it is refused with one line, or it equals an uninterrupted run."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import fedjax_dp.training.loop as loop_module
from fedjax_dp.training import results
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment
from fedjax_dp.training.workdir_lock import WorkdirInUse, WorkdirLock, WorkdirUnusable

TINY = [
    "--config.algorithm=dp_fedavg",
    "--config.eval_every=2",
    "--config.data.num_clients=20",
    "--config.client.epochs=1",
    "--config.client.batch_size=20",
    "--config.sampling.cohort_size=4",
    "--config.model.name=logistic",
]


def _cli(workdir, *extra, wait=True):
    args = [
        sys.executable,
        "-m",
        "fedjax_dp.cli",
        "--config=fedavg_mnist",
        f"--workdir={workdir}",
        "--noprogress",
        *TINY,
        *extra,
    ]
    log = open(f"{workdir}.log", "a")  # a file, not a pipe: a full pipe would block the child
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    if wait:
        process.wait(timeout=600)
    return process


def _log(workdir) -> str:
    return open(f"{workdir}.log").read()


def _kill_in_round_5(process, metrics):
    """SIGKILL ``process`` once its ``metrics.jsonl`` has a round-5 row."""
    deadline = time.time() + 600
    while process.poll() is None and time.time() < deadline:
        if metrics.exists() and any(line.startswith('{"round": 5,') for line in open(metrics)):
            break
        time.sleep(0.01)
    process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL, "the run ended before it could be killed"


def _privacy(workdir) -> dict:
    return json.load(open(os.path.join(workdir, "privacy.json")))


def _metrics(workdir) -> list[dict]:
    return results.read_metrics(str(workdir))


def test_overwrite_removes_the_earlier_runs_checkpoints_so_a_killed_resume_is_the_new_run(tmp_path):
    """Item 9: a 4-round run at z = 0.7, then --overwrite with 8 rounds at z = 2.0 killed after its
    round 4: its saves at rounds 2 and 4 were skipped (those steps existed), --resume restored the
    OLD run's model and reported 1.47 for a model that held four rounds at z ~ 0.7. Now the resume
    equals an uninterrupted run of the new config."""
    second = [
        "--config.rounds=8",
        "--config.checkpoint_every=2",
        "--config.dp.noise_multiplier=2.0",
    ]
    reference = _cli(tmp_path / "ref", *second)
    assert reference.returncode == 0, _log(tmp_path / "ref")
    first = _cli(
        tmp_path / "w",
        "--config.rounds=4",
        "--config.checkpoint_every=2",
        "--config.dp.noise_multiplier=0.7",
    )
    assert first.returncode == 0, _log(tmp_path / "w")
    old = _privacy(tmp_path / "w")["epsilon"]
    victim = _cli(tmp_path / "w", "--overwrite", *second, wait=False)
    # after its round-4 save (the old run had no round 5)
    _kill_in_round_5(victim, tmp_path / "w" / "metrics.jsonl")
    resumed = _cli(tmp_path / "w", "--resume", *second)
    assert resumed.returncode == 0, _log(tmp_path / "w")
    assert _privacy(tmp_path / "w")["epsilon"] == _privacy(tmp_path / "ref")["epsilon"] != old
    assert _metrics(tmp_path / "w") == _metrics(tmp_path / "ref")


def test_a_resume_without_config_json_is_verified_by_the_checkpoint(tmp_path, monkeypatch):
    """Item 10: with config.json deleted, a resume under another noise multiplier mixed two runs and
    re-accounted the first rounds at the new z (1.47 reported for rounds 1-4 at 0.737). The
    checkpoint now holds the config and what the tracker composed: another config is refused with
    one line; the same one continues exactly."""
    c = default_config()
    c.algorithm, c.rounds, c.eval_every, c.checkpoint_every = "dp_fedavg", 6, 2, 2
    c.data.num_clients, c.model.name, c.sampling.cohort_size = 20, "logistic", 4
    c.client.update(epochs=1, batch_size=20)
    c.dp.noise_multiplier = 0.737
    run_experiment(c, str(tmp_path / "ref"), progress=False)
    # SIGINT while round 4 is logged: it stops and checkpoints round 4
    with monkeypatch.context() as m:
        real_log = loop_module.results.ResultsWriter.log

        def log(self, row):
            real_log(self, row)
            if row.get("round") == 4:
                os.kill(os.getpid(), signal.SIGINT)

        m.setattr(loop_module.results.ResultsWriter, "log", log)
        assert run_experiment(c, str(tmp_path / "w"), progress=False).interrupted
    os.remove(tmp_path / "w" / "config.json")
    other = c.copy_and_resolve_references()
    other.dp.noise_multiplier = 2.0
    with pytest.raises(
        ValueError,
        match=r"cannot resume from .*round_000004: it was written by another config: "
        r"dp\.noise_multiplier: saved 0\.737, now 2\.0",
    ):
        run_experiment(other, str(tmp_path / "w"), progress=False, resume=True)
    summary = run_experiment(c, str(tmp_path / "w"), progress=False, resume=True)
    assert (
        summary.rounds == 6
        and _privacy(tmp_path / "w")["epsilon"] == _privacy(tmp_path / "ref")["epsilon"]
    )
    assert _metrics(tmp_path / "w") == _metrics(tmp_path / "ref")
    # written back once the checkpoint verified it
    assert os.path.exists(tmp_path / "w" / "config.json")
    assert summary.seconds_total > summary.seconds > 0  # item 12: both segments counted


def _interrupted_run(tmp_path, monkeypatch, name, stop_after=5):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every, c.checkpoint_every, c.checkpoint_keep = (
        "dp_fedavg",
        6,
        2,
        2,
        0,
    )
    c.data.num_clients, c.model.name, c.sampling.cohort_size = 20, "logistic", 4
    c.client.update(epochs=1, batch_size=20)
    with monkeypatch.context() as m:
        real_log = loop_module.results.ResultsWriter.log

        def log(self, row):
            real_log(self, row)
            if row.get("round") == stop_after:
                os.kill(os.getpid(), signal.SIGINT)

        m.setattr(loop_module.results.ResultsWriter, "log", log)
        run_experiment(c, str(tmp_path / name), progress=False)
    return c


@pytest.mark.parametrize("damage", ["truncated state", "garbled loop record"])
def test_a_damaged_newest_checkpoint_is_set_aside_and_resume_continues_from_the_newest_intact_one(
    tmp_path, monkeypatch, caplog, damage
):
    """Item 11: a truncated params file gave a 146-line orbax traceback, a garbled loop record
    'Expecting value' naming no file. Now a one-line warning names the step, resume continues from
    the older one, and the run ends equal to an uninterrupted one; with every checkpoint damaged,
    one line names the newest."""
    c = _interrupted_run(tmp_path, monkeypatch, "w")
    run_experiment(c, str(tmp_path / "ref"), progress=False)
    newest = tmp_path / "w" / "checkpoints" / "round_000005"
    files = [
        os.path.join(d, f)
        for d, _, fs in os.walk(newest / ("state" if "state" in damage else "loop"))
        for f in fs
    ]
    for path in files:
        with open(path, "r+b") as f:
            if "truncated" in damage:
                f.truncate(max(os.path.getsize(path) // 3, 1))
            else:
                f.write(b"\x00garbage")
    with caplog.at_level("WARNING"):
        run_experiment(c, str(tmp_path / "w"), progress=False, resume=True)
    assert any(
        "round_000005 cannot be read" in r.getMessage() and "resuming from" in r.getMessage()
        for r in caplog.records
    )
    assert _metrics(tmp_path / "w") == _metrics(tmp_path / "ref")
    assert _privacy(tmp_path / "w")["epsilon"] == _privacy(tmp_path / "ref")["epsilon"]


def test_when_no_checkpoint_can_be_read_resume_fails_with_one_line_naming_the_newest(
    tmp_path, monkeypatch
):
    c = _interrupted_run(tmp_path, monkeypatch, "w", stop_after=3)
    for step in (tmp_path / "w" / "checkpoints").iterdir():
        for d, _, fs in os.walk(step / "loop"):
            for f in fs:
                open(os.path.join(d, f), "w").write("{not json")
    with pytest.raises(
        ValueError, match=r"no checkpoint under .* can be read; the newest, .*round_000003: "
    ):
        run_experiment(c, str(tmp_path / "w"), progress=False, resume=True)


def test_a_full_disk_is_one_line_and_privacy_json_is_written_before_the_final_checkpoint(
    tmp_path, monkeypatch
):
    """Item 13: near a full disk the final checkpoint was written before privacy.json and
    summary.json, so a finished run lost them; and a full disk while writing a results file is now
    one line naming the path."""
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = "dp_fedavg", 2, 2
    c.data.num_clients, c.model.name, c.sampling.cohort_size = 12, "logistic", 4
    c.client.update(epochs=1, batch_size=20)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(loop_module.Checkpointer, "save", lambda self, *a, **k: full())
    with pytest.raises(OSError):
        run_experiment(c, str(tmp_path / "a"), progress=False)
    assert os.path.exists(tmp_path / "a" / "privacy.json") and os.path.exists(
        tmp_path / "a" / "summary.json"
    )
    monkeypatch.undo()
    real_replace = os.replace

    def refuse_privacy(src, dst):
        if str(dst).endswith("privacy.json"):
            full()
        return real_replace(src, dst)

    monkeypatch.setattr(results.os, "replace", refuse_privacy)
    with pytest.raises(results.ResultsWriteError) as error:
        run_experiment(c, str(tmp_path / "b"), progress=False)
    line = error.value.strerror
    assert (
        "\n" not in line
        and "cannot write" in line
        and "privacy.json" in line
        and "MB free on the disk of" in line
    )
    # no half-written file left
    assert not [f for f in os.listdir(tmp_path / "b") if f.endswith(".tmp")]


def test_two_runs_in_one_workdir_the_second_fails_at_once_naming_the_first(tmp_path):
    """Item 14: two --overwrite runs into one workdir interleaved their rows and both crashed."""
    first = _cli(tmp_path / "w", "--config.rounds=100000", wait=False)
    try:
        deadline = time.time() + 300
        while (
            not (tmp_path / "w" / "metrics.jsonl").exists()
            and first.poll() is None
            and time.time() < deadline
        ):
            time.sleep(0.05)
        assert first.poll() is None, _log(tmp_path / "w")
        second = _cli(tmp_path / "w", "--overwrite", "--config.rounds=2")
        assert second.returncode == 2
        assert f"is in use by another run (process {first.pid} on " in _log(tmp_path / "w")
        with pytest.raises(WorkdirInUse, match=f"process {first.pid}"):
            c = default_config()
            run_experiment(c, str(tmp_path / "w"), overwrite=True, progress=False)
    finally:
        first.kill()
        first.wait(timeout=60)


def test_sigint_exits_130_after_checkpointing(tmp_path):
    """Item 15: an interrupted run checkpointed and wrote interrupted: true, but exited 0."""
    run = _cli(tmp_path / "w", "--config.rounds=200", "--config.checkpoint_every=1", wait=False)
    deadline = time.time() + 300
    while (
        not (tmp_path / "w" / "checkpoints" / "round_000002").exists()
        and run.poll() is None
        and time.time() < deadline
    ):
        time.sleep(0.02)
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=300) == 130, _log(tmp_path / "w")
    summary = json.load(open(tmp_path / "w" / "summary.json"))
    assert summary["interrupted"] is True and "--resume continues it" in _log(tmp_path / "w")


@pytest.mark.parametrize("config", ["dp_fedavg_mnist", "fedavg_mnist"])
def test_diverging_training_stops_the_run_says_so_and_exits_3(tmp_path, config):
    """Item 16: dp_fedavg_mnist at client.learning_rate=1e9 trained at chance to the end (train_loss
    2.9e26 from round 1, rc 0, epsilon spent); fedavg_mnist stopped but said stopped_early: false.
    Both now stop and exit 3."""
    args = [
        sys.executable,
        "-m",
        "fedjax_dp.cli",
        f"--config={config}",
        f"--workdir={tmp_path / 'w'}",
        "--noprogress",
        "--config.rounds=30",
        "--config.eval_every=10",
        "--config.client.learning_rate=1e9",
    ]
    with open(f"{tmp_path / 'w'}.log", "w") as log:
        run = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, timeout=600)
    assert run.returncode == 3, _log(tmp_path / "w")
    summary = json.load(open(tmp_path / "w" / "summary.json"))
    assert (
        summary["diverged"] is True and summary["stopped_early"] is True and summary["rounds"] < 30
    )
    assert "diverged" in summary["stop_reason"] and f"error: {summary['stop_reason']}" in _log(
        tmp_path / "w"
    )


def test_an_infinite_clip_is_refused_before_anything_is_written(tmp_path):
    """Item 17: dp.clip_norm=inf passed the '> 0' check, config.json held 'Infinity', privacy.json
    said
    formal: true, and round 1 failed."""
    run = _cli(tmp_path / "w", "--config.dp.clip_norm=inf", "--config.rounds=2")
    assert run.returncode == 2
    assert "dp.clip_norm=inf: must be a finite number" in _log(tmp_path / "w")
    assert not (tmp_path / "w").exists()


def _tiny_dp_config(rounds=2):
    c = default_config()
    c.algorithm, c.rounds, c.eval_every = "dp_fedavg", rounds, rounds
    c.data.num_clients, c.model.name, c.sampling.cohort_size = 12, "logistic", 4
    c.client.update(epochs=1, batch_size=20)
    return c


def test_a_full_disk_at_the_end_writes_privacy_and_the_model_first_and_tries_every_other_file(
    tmp_path, monkeypatch
):
    """A full disk at the end of a run (no checkpoint before it) lost privacy.json, summary.json
    and the model: the first file written, client_accuracies.json, failed and nothing after it was
    tried. privacy.json and the final checkpoint now come first, and every file is tried."""
    written = []
    real_replace, real_save = os.replace, loop_module.Checkpointer.save

    def replace(src, dst):
        written.append(os.path.basename(str(dst)))
        if str(dst).endswith("client_accuracies.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)

    def save(self, *args, **kwargs):
        written.append("checkpoint")
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(results.os, "replace", replace)
    monkeypatch.setattr(loop_module.Checkpointer, "save", save)
    with pytest.raises(results.ResultsWriteError, match="client_accuracies.json") as error:
        run_experiment(_tiny_dp_config(), str(tmp_path / "w"), progress=False)
    assert "\n" not in error.value.strerror
    assert written[written.index("privacy.json") :][:2] == ["privacy.json", "checkpoint"]
    for name in ("privacy.json", "summary.json", "results.png", "checkpoints/round_000002"):
        assert os.path.exists(tmp_path / "w" / name), name


def test_a_failed_resume_of_a_workdir_that_never_ran_says_so_and_leaves_no_folder(tmp_path):
    """A --resume into a folder that never held a run loaded the data, failed at the checkpoint
    and left a new folder holding a lock file."""
    with pytest.raises(FileNotFoundError, match="no run to continue in .*new"):
        run_experiment(_tiny_dp_config(), str(tmp_path / "new" / "w"), progress=False, resume=True)
    assert not (tmp_path / "new").exists()


def test_a_resume_of_a_workdir_without_metrics_jsonl_names_the_missing_file(tmp_path):
    """It failed with a bare '[Errno 2] No such file or directory'."""
    run_experiment(_tiny_dp_config(), str(tmp_path / "w"), progress=False)
    os.remove(tmp_path / "w" / "metrics.jsonl")
    with pytest.raises(FileNotFoundError, match="holds checkpoints but no metrics.jsonl"):
        run_experiment(_tiny_dp_config(), str(tmp_path / "w"), progress=False, resume=True)


SPY_ON_VALIDATION = """
import sys
import fedjax_dp.training.config_validation as validation
real = validation.validate_config
def spy(*args, **kwargs):
    print("VALIDATING", flush=True)
    return real(*args, **kwargs)
validation.validate_config = spy
from fedjax_dp.cli import main
sys.exit(main(["fedjax-dp"] + sys.argv[1:]))
"""


def test_the_workdir_is_locked_before_the_config_is_validated_and_calibrated(tmp_path):
    """The lock was taken after validation and calibration (about 80 s under load), so a second
    run into a busy workdir learnt it only then."""
    with WorkdirLock(str(tmp_path / "w")):
        run = subprocess.run(
            [sys.executable, "-c", SPY_ON_VALIDATION, "--config=dp_fedavg_mnist"]
            + [f"--workdir={tmp_path / 'w'}", "--noprogress"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert run.returncode == 2 and "is in use by another run" in run.stderr, run.stderr
    assert "VALIDATING" not in run.stdout


def test_an_unusable_workdir_is_one_line_naming_why(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(WorkdirUnusable, match="it is a file, not a folder"):
        WorkdirLock(str(tmp_path / "file")).__enter__()
    with pytest.raises(WorkdirUnusable, match="is a file, not a folder, so nothing can be created"):
        WorkdirLock(str(tmp_path / "file" / "below")).__enter__()
    with pytest.raises(WorkdirUnusable, match=r"cannot create it \(.+\)"):
        WorkdirLock("/sys/fedjax_dp_workdir").__enter__()
