"""``Experiment``, the CLI and ``fedjax_dp.use_a_device_per_core()`` give JAX one CPU device per
core unless the user chose (``core.host_devices``); ``import fedjax_dp`` alone changes no JAX
setting (issue 73 item 7)."""

import os
import subprocess
import sys

import pytest

from fedjax_dp.core.host_devices import host_cores

PROBE = (
    "import fedjax_dp, jax; fedjax_dp.use_a_device_per_core(); print('DEVICES',"
    " len(jax.devices('cpu')))"
)


def _devices_after(env_changes: dict, code: str = PROBE) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "FEDJAX_DP_CPU_DEVICES")
    }
    env.update(env_changes, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "env, want",
    [
        ({}, host_cores()),  # a device per core
        ({"FEDJAX_DP_CPU_DEVICES": "3"}, 3),
        ({"FEDJAX_DP_CPU_DEVICES": "1"}, 1),  # JAX's default kept
        ({"JAX_NUM_CPU_DEVICES": "1"}, 1),  # the user's JAX setting stands
        ({"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}, 4),
    ],
)
def test_cpu_devices_when_asked(env, want):
    out = _devices_after(env)
    assert f"DEVICES {want}\n" in out.stdout, out.stderr[-2000:]


def test_the_import_alone_changes_no_jax_setting():
    """Before: ``import fedjax_dp`` set ``jax_num_cpu_devices`` (3 devices here); now JAX keeps its
    one."""
    out = _devices_after(
        {"FEDJAX_DP_CPU_DEVICES": "3"},
        "import fedjax_dp, jax; print('SETTING', jax.config.jax_num_cpu_devices); "
        "print('DEVICES', len(jax.devices('cpu')))",
    )
    assert "SETTING -1\n" in out.stdout and "DEVICES 1\n" in out.stdout, (
        out.stdout,
        out.stderr[-2000:],
    )


def test_an_experiment_asks_before_it_loads_anything():
    out = _devices_after(
        {"FEDJAX_DP_CPU_DEVICES": "3"},
        "import fedjax_dp, jax; fedjax_dp.Experiment('fedavg_mnist', {'rounds': 1}); "
        "print('DEVICES', len(jax.devices('cpu')))",
    )
    assert "DEVICES 3\n" in out.stdout, out.stderr[-2000:]


def test_jax_started_before_keeps_its_devices():
    out = _devices_after({}, "import jax; jax.numpy.ones(1); " + PROBE)
    assert "DEVICES 1\n" in out.stdout, out.stderr[-2000:]


def test_a_bad_device_count_is_refused_naming_the_variable_and_value():
    out = _devices_after({"FEDJAX_DP_CPU_DEVICES": "two"})
    assert (
        out.returncode != 0
        and "FEDJAX_DP_CPU_DEVICES must be an integer >= 1" in out.stderr
        and "'two'" in out.stderr
    )


def test_the_cli_refuses_a_bad_device_count_in_one_line():
    out = _devices_after(
        {"FEDJAX_DP_CPU_DEVICES": "two"},
        "import sys; from fedjax_dp.cli import main; sys.exit(main(['fedjax-dp',"
        " '--config=fedavg_mnist']))",
    )
    assert (
        out.returncode == 2 and "error: FEDJAX_DP_CPU_DEVICES must be an integer >= 1" in out.stderr
    ), out.stderr[-2000:]
