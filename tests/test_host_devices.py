"""``import fedjax_dp`` gives JAX one CPU device per core unless the user chose (``core.host_devices``)."""

import os
import subprocess
import sys

import pytest

from fedjax_dp.core.host_devices import host_cores

PROBE = "import fedjax_dp, jax; print('DEVICES', len(jax.devices('cpu')))"


def _devices_after_import(env_changes: dict, code: str = PROBE) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "FEDJAX_DP_CPU_DEVICES")}
    env.update(env_changes, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("env, want", [
    ({}, host_cores()),  # a device per core
    ({"FEDJAX_DP_CPU_DEVICES": "3"}, 3),
    ({"FEDJAX_DP_CPU_DEVICES": "1"}, 1),  # JAX's default kept
    ({"JAX_NUM_CPU_DEVICES": "1"}, 1),  # the user's JAX setting stands
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}, 4),
])
def test_cpu_devices_after_import(env, want):
    out = _devices_after_import(env)
    assert f"DEVICES {want}\n" in out.stdout, out.stderr[-2000:]


def test_jax_started_before_the_import_keeps_its_devices():
    out = _devices_after_import({}, "import jax; jax.numpy.ones(1); " + PROBE)
    assert "DEVICES 1\n" in out.stdout, out.stderr[-2000:]


def test_a_bad_device_count_is_refused_naming_the_variable_and_value():
    out = _devices_after_import({"FEDJAX_DP_CPU_DEVICES": "two"})
    assert out.returncode != 0 and "FEDJAX_DP_CPU_DEVICES must be an integer >= 1" in out.stderr and "'two'" in out.stderr
