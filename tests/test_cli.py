"""The ``fedjax-dp`` command: shipped configs by name from any folder, overrides reach the run,
every results file is strict JSON, bad input is refused in one line naming the key and the closest
valid one, before any data is loaded, and a run that cannot train exits non-zero."""

import json
import os
import subprocess
import sys

import pytest


# the package beside these tests, not whichever one is installed (run from another folder)
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, cwd, config="fedavg_mnist"):
    return subprocess.run(
        [sys.executable, "-m", "fedjax_dp", f"--config={config}", "--noprogress", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": REPOSITORY},
    )


def strict_json(text: str):
    """json.loads that refuses NaN / Infinity (what jq and JavaScript's JSON.parse do)."""

    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_a_shipped_config_runs_by_name_outside_the_repository(tmp_path):
    out = run_cli(
        "--config.rounds=3",
        "--config.eval_every=2",
        "--config.model.name=logistic",
        "--config.sampling.cohort_size=4",
        f"--workdir={tmp_path}/run",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [strict_json(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]  # round 0: the initial model
    assert rows[0]["client_updates"] == 0 and "test_accuracy" in rows[0]
    assert all(r["cohort_size"] == 4 for r in rows[1:]) and rows[-1]["client_updates"] == 12
    assert "test_accuracy" in rows[2] and "test_accuracy" not in rows[1]
    for name in ("config.json", "summary.json", "privacy.json", "client_accuracies.json"):
        strict_json(open(tmp_path / "run" / name).read())
    assert strict_json(open(tmp_path / "run" / "config.json").read())["model"]["name"] == "logistic"
    assert os.path.getsize(tmp_path / "run" / "results.png") > 1000
    assert "best accuracy" in out.stdout
    # no orbax INFO lines by default
    assert "checkpoint_manager" not in out.stderr and "I1" not in out.stderr
    again = run_cli("--config.rounds=1", f"--workdir={tmp_path}/run", cwd=tmp_path)
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_help_lists_the_configs_and_every_key_with_its_meaning(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "fedjax_dp", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0
    for fragment in (
        "dp_fedavg_mnist",
        "cuag_pfl_cifar10",
        "ldp_minibatch_mnist",
        "dp.noise_multiplier=1.0",
        "z: Gaussian noise std",
        "sampling.method='uniform'",
        "--seeds",
        "--sweep_budget",
    ):
        assert fragment in out.stdout
    assert "(undocumented)" not in out.stdout
    # item 23: one spelling
    assert "[--noprogress]" in out.stdout and "--[no]progress" in out.stdout
    assert "  --progress " not in out.stdout


def test_the_printed_summary_gives_epsilons_delta_and_formal_flag_and_says_what_cc_is(tmp_path):
    """Issue 74, item 21: 'epsilon spent' had no delta or formal flag; 'client updates (CC)' did not
    say what CC is."""
    out = run_cli(
        "--config.algorithm=dp_fedavg",
        "--config.rounds=2",
        "--config.eval_every=2",
        "--config.model.name=logistic",
        "--config.sampling.cohort_size=4",
        f"--workdir={tmp_path}/run",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    epsilon = next(line for line in out.stdout.splitlines() if line.startswith("epsilon spent"))
    assert epsilon.endswith("at delta 1e-05  (formal: true)")
    assert "(communication cost: updates sent)" in out.stdout


def test_a_typo_on_the_command_line_is_one_line_naming_the_closest_key(tmp_path):
    out = run_cli("--config.dp.noise_multipler=3", f"--workdir={tmp_path}/t", cwd=tmp_path)
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        == "error: unknown config key 'dp.noise_multipler'; did you mean 'dp.noise_multiplier'?"
    )
    assert not os.path.exists(tmp_path / "t")


def test_a_typo_in_a_config_file_is_refused_with_its_line_and_the_closest_key(tmp_path):
    (tmp_path / "mine.py").write_text(
        "from fedjax_dp.training.default_config import default_config\n\n"
        "def get_config():\n    c = default_config()\n    c.algorithm = 'dp_fedavg'\n"
        "    c.dp.noise_multipler = 3.0\n    return c\n"
    )
    out = run_cli(f"--workdir={tmp_path}/t", cwd=tmp_path, config=str(tmp_path / "mine.py"))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "mine.py:6" in lines[0] and '"noise_multiplier"' in lines[0], (
        out.stderr
    )


def test_an_unknown_config_name_suggests_the_closest(tmp_path):
    out = run_cli(cwd=tmp_path, config="dp_fedavg_mnsit")
    assert out.returncode == 2 and "did you mean 'dp_fedavg_mnist'?" in out.stderr


def test_a_bad_config_argument_is_one_line_with_the_config_files_own_message(tmp_path):
    """Found 2026-11-29: ``--config=geyer_mnist:999`` printed ml_collections' whole traceback
    flattened into one line; the message get_config raised is what a user needs."""
    for spec, message in (
        ("geyer_mnist:999", "K must be one of [100, 1000, 10000], got 999"),
        (
            "geyer_mnist:100:poison",
            "only ':poisson' may follow K (geyer_mnist:K[:poisson]), got 'poison'",
        ),
    ):
        out = run_cli(f"--workdir={tmp_path}/g", cwd=tmp_path, config=spec)
        assert out.returncode == 2
        assert out.stderr.strip() == f"error: --config={spec}: {message}"
    assert not os.path.exists(tmp_path / "g")


def test_an_override_on_the_command_line_that_nothing_reads_is_refused(tmp_path):
    """``--config.sampling.cohort_size=50`` under the config's Poisson sampling ran q K clients a
    round without a word (found 2026-11-29); now exit 2 naming the key, before any data or
    workdir."""
    out = run_cli(
        "--config.sampling.cohort_size=50",
        f"--workdir={tmp_path}/c",
        cwd=tmp_path,
        config="dp_fedavg_mnist",
    )
    assert out.returncode == 2
    assert (
        "sampling.cohort_size=50 is not read while sampling.method='poisson' (only with"
        " sampling.method 'uniform' or 'min_separation' or 'single'): change sampling.method or"
        " drop sampling.cohort_size" in out.stderr
    )
    assert not os.path.exists(tmp_path / "c")


def test_a_missing_or_uncallable_config_file_is_one_line(tmp_path):
    """Found 2026-11-29: ``--config=missing.py`` ended in two chained tracebacks (the config flag's
    value raises OSError only when first read, outside the CLI's error handling), and a file whose
    ``get_config`` takes no argument, given one, in ml_collections' flattened traceback."""
    out = run_cli(f"--workdir={tmp_path}/m", cwd=tmp_path, config="missing.py")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == "error: --config: no such config file 'missing.py'"
    (tmp_path / "mine.py").write_text(
        "import fedjax_dp\n\n\ndef get_config():\n    return fedjax_dp.default_config()\n"
    )
    out = run_cli(f"--workdir={tmp_path}/m", cwd=tmp_path, config="mine.py:3")
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        == "error: --config=mine.py:3: TypeError: get_config() takes 0 positional arguments "
        "but 1 was given"
    )
    assert not os.path.exists(tmp_path / "m")


def test_invalid_config_lists_every_error_before_loading(tmp_path):
    out = run_cli(
        "--config.rounds=0",
        "--config.client.batch_size=0",
        "--config.sampling.cohort_size=500",
        "--config.data.partition=bogus",
        "--config.engine.stream_clients=-1",
        "--config.engine.max_replicated_gb=-2",
        "--config.engine.deferred_dense=always",
        f"--workdir={tmp_path}/bad",
        cwd=tmp_path,
    )
    assert out.returncode == 2
    for fragment in (
        "rounds must be >= 1, got 0",
        "client.batch_size must be >= 1, got 0",
        "sampling.cohort_size must lie in [1, data.num_clients=100], got 500",
        "data.partition 'bogus' unknown",
        "engine.stream_clients must be an integer >= 0",
        "got -1",
        "engine.max_replicated_gb must be a number >= 0 (0 = never copy: one device), got -2",
        "engine.deferred_dense 'always' unknown; available: ('auto', 'on', 'off')",
    ):
        assert fragment in out.stderr
    assert "Traceback" not in out.stderr
    assert not os.path.exists(tmp_path / "bad")


def test_a_run_that_cannot_train_one_round_exits_non_zero_with_the_reason(tmp_path):
    """A budget stop below what one round spends: the configuration check refuses it (exit 2);
    per-client budgets too small for any client's first round stop the run before round 1 (exit 1,
    the reason)."""
    out = run_cli(
        "--config.algorithm=dp_fedavg",
        "--config.dp.noise_multiplier=0.3",
        "--config.privacy.max_epsilon=0.5",
        f"--workdir={tmp_path}/nb",
        cwd=tmp_path,
    )
    assert (
        out.returncode == 2 and "privacy.max_epsilon=0.5 is spent before round 1 ends" in out.stderr
    )
    out = run_cli(
        "--config.algorithm=dp_fedavg",
        "--config.privacy.client_epsilon_budget=0.01",
        "--config.rounds=3",
        f"--workdir={tmp_path}/nb",
        cwd=tmp_path,
    )
    assert out.returncode == 1 and "no round could run (privacy budget)" in out.stderr


@pytest.mark.parametrize("flag", ["--seeds=0,1"])
def test_several_seeds_report_mean_and_interval(tmp_path, flag):
    out = run_cli(
        "--config.rounds=2",
        "--config.eval_every=1",
        "--config.model.name=logistic",
        "--config.sampling.cohort_size=3",
        flag,
        f"--workdir={tmp_path}/s",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    summary = strict_json(open(tmp_path / "s" / "seeds_summary.json").read())
    accuracy = summary["final"]["test_accuracy"]
    assert (
        accuracy["n"] == 2
        and len(accuracy["values"]) == 2
        and accuracy["ci95_half_width"] is not None
    )
    per_seed = [
        strict_json(open(tmp_path / "s" / f"seed_{s}" / "summary.json").read())["final"][
            "test_accuracy"
        ]
        for s in (0, 1)
    ]
    assert accuracy["values"] == pytest.approx(per_seed) and accuracy["mean"] == pytest.approx(
        sum(per_seed) / 2
    )
    assert per_seed[0] != per_seed[1]  # the seed reached the run
    assert os.path.getsize(tmp_path / "s" / "seeds.png") > 1000
    assert "95 % CI" in out.stdout


def test_a_value_of_the_wrong_type_is_one_line_saying_what_the_key_takes():
    """``--config.privacy.target_epsilon=None`` (a new user turning calibration off) said only
    "could not convert string to float: 'None'"; the line now adds the key's meaning, which says
    that 0 turns it off."""
    from absl import flags

    from fedjax_dp.cli import _one_line

    error = flags.IllegalFlagValueError(
        "flag --config.privacy.target_epsilon=None: could not convert string to float: 'None'"
    )
    line = _one_line(error)
    assert line.startswith(
        "--config.privacy.target_epsilon=None: could not convert string to float: 'None' ("
    )
    assert "0: off" in line and "\n" not in line


def test_bad_seeds_and_a_workdir_that_is_a_file_are_one_line_naming_the_option(tmp_path):
    """They gave Python's and the OS's own messages: "invalid literal for int() with base 10",
    "[Errno 17] File exists"."""
    seeds = run_cli("--seeds", "0,x", f"--workdir={tmp_path / 's'}", cwd=tmp_path)
    assert seeds.returncode == 2
    assert seeds.stderr.strip() == (
        "error: --seeds=0,x: every seed must be an integer >= 0 (e.g. --seeds 0,1,2), got 'x'"
    )
    (tmp_path / "file").write_text("")
    workdir = run_cli(f"--workdir={tmp_path / 'file'}", cwd=tmp_path)
    assert workdir.returncode == 2
    assert workdir.stderr.strip() == (
        f"error: --workdir={tmp_path / 'file'}: it is a file, not a folder"
    )


def test_help_fits_in_120_columns():
    """83 of its lines were wider than 120 characters."""
    from fedjax_dp.cli import help_text

    text = help_text()
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "--seeds" in text and "dp.noise_multiplier" in text
