"""The command's persistent compilation cache: a second run loads every program the first compiled,
with the same results; ``off``, an earlier choice and a folder that cannot be made leave JAX's
setting alone."""

import json
import logging
import os
import subprocess
import sys

import jax

from fedjax_dp.training import compilation_cache


def _run(tmp_path, cache):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(
        FEDJAX_DP_COMPILATION_CACHE=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedjax_dp",
            "--config=fedavg_mnist",
            "--noprogress",
            "--overwrite",
            "--config.rounds=2",
            "--config.model.name=logistic",
            "--config.sampling.cohort_size=4",
            f"--workdir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]


def _entries(folder):
    """Each cached program's key -> its last-use stamp (JAX's eviction record, rewritten on every
    load)."""
    return {
        name[: -len("-atime")]: (folder / name).read_bytes()
        for name in os.listdir(folder)
        if name.endswith("-atime")
    }


def test_a_second_run_of_the_command_loads_every_program_the_first_compiled(tmp_path):
    cache = tmp_path / "xla"
    first = _run(tmp_path, cache)
    written = _entries(cache)
    # the cohort program at least
    assert any(key.startswith("jit_trace-") for key in written), sorted(written)
    second = _run(tmp_path, cache)
    loaded = _entries(cache)
    assert loaded.keys() == written.keys()  # nothing compiled anew
    assert all(loaded[key] != written[key] for key in written), (
        "a program was compiled again, not loaded"
    )
    assert second == first  # the same executables: the same metrics, bit for bit


def test_off_an_earlier_choice_or_a_folder_that_cannot_be_made_leaves_jax_alone(
    tmp_path, monkeypatch, caplog
):
    chosen = jax.config.jax_compilation_cache_dir  # the test session's own cache (conftest)
    assert chosen and compilation_cache.use_persistent_cache() is None  # an earlier choice stands
    assert jax.config.jax_compilation_cache_dir == chosen
    (tmp_path / "a_file").write_text("")
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        monkeypatch.setenv(compilation_cache.ENV, "off")
        assert (
            compilation_cache.use_persistent_cache() is None
            and jax.config.jax_compilation_cache_dir is None
        )
        monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "a_file" / "xla"))
        with caplog.at_level(logging.WARNING):
            assert compilation_cache.use_persistent_cache() is None
        assert jax.config.jax_compilation_cache_dir is None
        assert "a_file" in caplog.text and compilation_cache.ENV in caplog.text
        monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "made"))
        assert compilation_cache.use_persistent_cache() == str(tmp_path / "made")
        assert (
            jax.config.jax_compilation_cache_dir == str(tmp_path / "made")
            and (tmp_path / "made").is_dir()
        )
        assert jax.config.jax_compilation_cache_max_size == compilation_cache.MAX_BYTES
    finally:
        jax.config.update("jax_compilation_cache_dir", chosen)
        jax.config.update("jax_compilation_cache_max_size", -1)


def test_the_default_folder_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compilation_cache.default_folder() == str(tmp_path / "fedjax_dp" / "xla")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compilation_cache.default_folder() == os.path.expanduser("~/.cache/fedjax_dp/xla")
