"""The benchmarks' own harness runs every formulation it offers (the numbers themselves are measured
by the benchmarks, never asserted here)."""

import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.mark.parametrize("strategy", ["loop", "sequential"])
def test_program_memory_covers_every_strategy(strategy):
    """Bug: ``WorkloadW.program_memory`` traced the cohort engine inside jit, which the ``loop``
    strategy (a Python loop over per-client programs) cannot be, so every ``loop`` case of
    ``cohort_throughput.py`` failed, the regression pair ``cnn:10:loop:-:full:im2col`` /
    ``...:xla`` among them. For ``loop`` it analyses the one-client program the loop calls."""
    sys.path.insert(0, BENCHMARKS)
    try:
        from workload_w import WorkloadW
    finally:
        sys.path.remove(BENCHMARKS)
    work = WorkloadW("mlp", strategy, None, 1, "xla")
    memory = work.program_memory(2)
    assert set(memory) == {"argument", "output", "temp", "alias"}
    assert memory["argument"] > 0 and all(isinstance(v, int) for v in memory.values())


def test_workload_w_defers_the_cnn_dense_kernel_unless_the_case_says_plain():
    """``~plain`` cases measure local training without deferred dense kernels
    (``engine.deferred_dense``); both formulations upload the same clipped delta up to float
    rounding."""
    import jax
    import numpy as np

    sys.path.insert(0, BENCHMARKS)
    try:
        from cohort_throughput import parse_case
        from workload_w import WorkloadW
    finally:
        sys.path.remove(BENCHMARKS)
    assert parse_case("cnn:100:auto~plain")["deferred_dense"] is False
    assert parse_case("cnn:100:loop:-:full:xla@10")["deferred_dense"] is None  # auto: on a CPU
    outs = []
    for deferred in (True, False):
        work = WorkloadW("cnn", "loop", None, True, "xla", deferred_dense=deferred)
        client = jax.tree_util.tree_map(lambda x: x[0], work._cohort(0, 1))
        outs.append(jax.jit(work.engine.client_fn)(work.params, client))
    for got, want in zip(jax.tree_util.tree_leaves(outs[0]), jax.tree_util.tree_leaves(outs[1])):
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-5 * float(np.abs(np.asarray(want)).max())
        )


def test_program_hlo_names_cohort_sized_values_outside_fusion_bodies(tmp_path):
    """``program_hlo.py`` (issue 20's GPU input copy): a program that makes a cohort-sized value of
    its own is listed with its op, the parameter and tuple plumbing are not, nor instructions inside
    fusion bodies; and the workload's report writes its files."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, BENCHMARKS)
    try:
        from program_hlo import cohort_sized, largest_values, report, value_bytes
    finally:
        sys.path.remove(BENCHMARKS)
    assert value_bytes("f32[100,28,28,1]") == 100 * 28 * 28 * 4 and value_bytes("bf16[3,2]") == 12
    assert value_bytes("pred[]") == 1
    text = (
        jax.jit(lambda x: (jnp.flip(x, 0) * 2.0, x.sum()))
        .lower(jax.ShapeDtypeStruct((100, 28, 28, 1), jnp.float32))
        .compile()
        .as_text()
    )
    made = cohort_sized(text, 100)
    assert made and all(v["op"] not in ("parameter", "get-tuple-element", "bitcast") for v in made)
    assert made[0]["type"] == "f32[100,28,28,1]" and made[0]["bytes"] == 100 * 28 * 28 * 4
    assert not cohort_sized(text, 7)
    listed = largest_values(text, top=100)
    assert any(v["op"] == "parameter" and v["type"] == "f32[100,28,28,1]" for v in listed)
    assert not any(
        v["computation"] and v["computation"].startswith("fused_computation") for v in listed
    )
    result = report("mlp:2:vmap", str(tmp_path))
    assert (tmp_path / "hlo.txt.gz").stat().st_size > 0 and (tmp_path / "largest.json").exists()
    assert result["program_memory_mib"]["argument"] > 0 and result["largest"]
