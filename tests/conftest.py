"""Shared test fixtures: tiny models and data, and the location of the optional shared data."""

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile

import jax
import numpy as np
import pytest

jax.config.update("jax_default_matmul_precision", "highest")

# The suite compiles hundreds of small programs and runs most of them for milliseconds, so LLVM's
# optimisation of
# XLA:CPU's generated code costs more than it saves: without it the whole suite took 15.9 min
# instead of 20.9 on a
# 2-core CPU (2026-12-02, nothing else running; golden runs + test_uga alternated: 136 s against 115
# s). The HLO passes (fusion, layout) still run,
# so the programs are the same; only their machine code is less optimised. Numbers the tests compare
# against one
# another come from one setting; golden values hold to their tolerance under both.
# FEDJAX_DP_TEST_OPTIMIZED=1 keeps
# XLA's defaults (the subprocess tests that set their own XLA_FLAGS do so too).
TEST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if os.environ.get("FEDJAX_DP_TEST_OPTIMIZED") != "1" and TEST_COMPILE_FLAGS not in os.environ.get(
    "XLA_FLAGS", ""
):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_COMPILE_FLAGS}".strip()

# One persistent XLA compilation cache for the whole session, the CLI and resume subprocesses
# included
# (through the environment): many tests compile the same programs (the default MNIST round, the same
# evaluation), and a hit loads the executable XLA built before instead of compiling it again (the
# same
# numbers: the same executable). A fresh folder per session, so nothing stale is ever loaded; the
# process
# that made it (the pytest controller) removes it at exit, the workers it starts inherit it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="fedjax_dp_tests_xla_")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update(
    "jax_persistent_cache_min_compile_time_secs",
    float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
)

# The devices the CLI and ``Experiment`` ask for (one CPU device per core), asked for before any
# test starts JAX,
# so hand-built rounds in tests run on the devices a user's run gets (importing fedjax_dp alone
# changes nothing).
from fedjax_dp.core.host_devices import use_a_device_per_core  # noqa: E402

use_a_device_per_core()

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
# the shipped configs read $FEDJAX_DP_DATA/<dataset> (data/local_files.py)
if os.path.isdir(SHARED_DATA):
    os.environ.setdefault("FEDJAX_DP_DATA", os.path.abspath(SHARED_DATA))
EXPERIMENTS = os.path.join(os.path.dirname(__file__), "..", "experiments")


def load_experiment(name: str):
    """Imports ``experiments/<name>.py`` (a script, not a package module), with ``experiments/`` on
    the path for the scripts that import one another."""
    if EXPERIMENTS not in sys.path:
        sys.path.insert(0, EXPERIMENTS)
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXPERIMENTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAX_WORKERS = 4
"""``-n auto`` (setup.cfg) starts one pytest-xdist worker per core, at most this many: each worker
imports JAX and TensorFlow and compiles its own programs (a few GB at peak), so a many-core machine
must not start dozens. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides it."""


def pytest_xdist_auto_num_workers(config):
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (each a minute or more on 2 cores, and covered in part by faster ones)
    run only with FEDJAX_DP_SLOW=1, so the default suite stays near 15 minutes on a 2-core
    machine."""
    if os.environ.get("FEDJAX_DP_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with FEDJAX_DP_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def shared_data_dir():
    if not os.path.isdir(SHARED_DATA):
        pytest.skip("../shared/data is absent on this machine")
    return SHARED_DATA


def random_client_data(rng: np.random.Generator, sizes, shape=(4, 4, 1), num_classes=3):
    """Per-client (x, y) arrays with the given example counts."""
    return [
        (
            rng.standard_normal((n,) + shape).astype(np.float32),
            rng.integers(0, num_classes, n).astype(np.int32),
        )
        for n in sizes
    ]


def two_logistic_clients(learning_rate=0.1):
    """``(params, cohort_of(seed), fedavg)``: a 16 -> 3 logistic model, two clients of 6 and 9
    random examples packed in batches of 4 (``cohort_of(seed)`` shuffles with that seed) and FedAvg
    with SGD."""
    import jax
    import optax

    from fedjax_dp.algorithms.fedavg import FedAvg
    from fedjax_dp.data.packing import pack_cohort
    from fedjax_dp.models import get_model

    model = get_model("logistic", (4, 4, 1), 3)
    data = random_client_data(np.random.default_rng(0), [6, 9])
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])

    def cohort_of(seed=0):
        return pack_cohort(
            x, y, [np.arange(6), np.arange(6, 15)], 4, 1, np.random.default_rng(seed)
        )

    return (
        model.init(jax.random.key(0)),
        cohort_of,
        FedAvg(model.per_example_loss, optax.sgd(learning_rate)),
    )


def make_round(
    model, algorithm="fedavg", num_clients=100, strategy="vmap", chunk_size=None, **overrides
):
    """A ``FederatedRound`` built as the experiment loop builds it (registry, wrappers, upload
    chain), from ``default_config()`` with ``overrides`` given as ``{"dp.clip": "median", ...}``."""
    from fedjax_dp.core.strategy import StrategyChoice
    from fedjax_dp.training.build import build_round
    from fedjax_dp.training.default_config import default_config

    cfg = default_config()
    cfg.algorithm = algorithm
    for path, value in overrides.items():
        section, _, key = path.rpartition(".")
        (cfg[section] if section else cfg)[key] = value
    choice = StrategyChoice(strategy=strategy, chunk_size=chunk_size, unroll=1, conv_impl="xla")
    return build_round(cfg, model, choice, num_clients)


def sigint_at_round(monkeypatch, round_index: int) -> None:
    """Sends this process a real SIGINT while round ``round_index`` is being logged (a resume test's
    interruption; use inside ``monkeypatch.context()`` so only the interrupted run is patched)."""
    import signal

    import fedjax_dp.training.loop as loop_module

    real_log = loop_module.results.ResultsWriter.log

    def log(self, row):
        real_log(self, row)
        if row.get("round") == round_index and not row.get("final_evaluation"):
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(loop_module.results.ResultsWriter, "log", log)
