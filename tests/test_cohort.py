"""The cohort engine: every strategy, and the device mesh, equal a plain Python loop over
clients."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dp.core.cohort import CohortEngine
from fedjax_dp.core.local_training import make_local_trainer
from fedjax_dp.data.packing import pack_cohort
from fedjax_dp.models import get_model

from conftest import random_client_data

TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # float32 sums in a different order


def make_problem(
    model_name="mlp_2nn", sizes=(9, 4, 13, 7, 1, 10, 6), shape=(4, 4, 1), conv_impl="xla"
):
    model = get_model(model_name, shape, 3, conv_impl=conv_impl)
    params = model.init(jax.random.key(0))
    data = random_client_data(np.random.default_rng(0), sizes, shape)
    x, y = np.concatenate([d[0] for d in data]), np.concatenate([d[1] for d in data])
    offsets = np.cumsum([0, *sizes])
    cohort = pack_cohort(
        x,
        y,
        [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sizes))],
        4,
        2,
        np.random.default_rng(1),
    )
    train = make_local_trainer(model.per_example_loss, optax.sgd(0.1))

    def client_fn(params, client):
        trained, stats = train(params, client["batches"], client["mask"], client["key"])
        delta = jax.tree_util.tree_map(jnp.subtract, trained, params)
        return delta, stats.loss

    clients = {
        "batches": cohort["batches"],
        "mask": cohort["mask"],
        "key": jax.random.split(jax.random.key(3), len(sizes)),
    }
    return client_fn, params, clients


def python_loop(client_fn, params, clients):
    n = clients["mask"].shape[0]
    outs = [client_fn(params, jax.tree_util.tree_map(lambda x: x[i], clients)) for i in range(n)]
    total = jax.tree_util.tree_map(lambda *xs: sum(xs), *[o[0] for o in outs])
    return total, np.array([o[1] for o in outs])


@pytest.mark.parametrize(
    "strategy,chunk",
    [
        ("vmap", None),
        ("chunked", 3),
        ("chunked", 7),
        ("chunked", 100),
        ("sequential", None),
        ("loop", None),
    ],
)
def test_strategies_equal_python_loop(strategy, chunk):
    client_fn, params, clients = make_problem()
    want_sum, want_loss = python_loop(client_fn, params, clients)
    got_sum, got_loss = CohortEngine(client_fn, strategy, chunk)(params, clients)
    for a, b in zip(jax.tree_util.tree_leaves(got_sum), jax.tree_util.tree_leaves(want_sum)):
        np.testing.assert_allclose(a, b, **TOLERANCE)
    np.testing.assert_allclose(got_loss, want_loss, **TOLERANCE)


@pytest.mark.parametrize("conv_impl", ["xla", "im2col"])
def test_cnn_strategies_agree(conv_impl):
    client_fn, params, clients = make_problem(
        "cnn_fedavg", sizes=(5, 3, 8), shape=(12, 12, 1), conv_impl=conv_impl
    )
    want_sum, _ = python_loop(client_fn, params, clients)
    for strategy, chunk in (("vmap", None), ("chunked", 2), ("loop", None)):
        got_sum, _ = CohortEngine(client_fn, strategy, chunk)(params, clients)
        for a, b in zip(jax.tree_util.tree_leaves(got_sum), jax.tree_util.tree_leaves(want_sum)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "strategy,chunk,stream",
    [
        ("vmap", None, 3),
        ("chunked", 2, 3),
        ("sequential", None, 4),
        ("vmap", None, 7),
        ("sequential", None, 1),
    ],
)
def test_streamed_cohorts_equal_python_loop_and_send_the_device_one_slice_at_a_time(
    strategy, chunk, stream
):
    """``stream_size``: the 7 clients reach the program in host slices of ``stream`` (the last
    padded with masked copies of its last client, so one program serves all); sums and per-client
    rows as unstreamed."""
    client_fn, params, clients = make_problem()
    want_sum, want_loss = python_loop(client_fn, params, clients)
    engine = CohortEngine(client_fn, strategy, chunk, stream_size=stream)
    seen = []
    traced = engine.trace
    object.__setattr__(
        engine, "trace", lambda s, c, v=None: (seen.append(c["mask"].shape[0]), traced(s, c, v))[1]
    )
    got_sum, got_loss = engine(params, clients)
    for a, b in zip(jax.tree_util.tree_leaves(got_sum), jax.tree_util.tree_leaves(want_sum)):
        np.testing.assert_allclose(a, b, **TOLERANCE)
    np.testing.assert_allclose(got_loss, want_loss, **TOLERANCE)
    # traced once, for one slice's clients (7: the cohort fits one slice)
    assert seen == [min(stream, 7)]
    with pytest.raises(ValueError, match="stream_size must be >= 1"):
        CohortEngine(client_fn, strategy, chunk, stream_size=0)


def test_nan_in_a_padding_client_cannot_leak():
    def client_fn(shared, client):
        return client["v"] * shared, client["v"]

    clients = {"v": jnp.arange(1.0, 6.0)}
    total, per_client = CohortEngine(client_fn, "chunked", 4)(jnp.float32(2.0), clients)
    assert float(total) == 2.0 * 15.0 and per_client.shape == (5,)


def test_bad_strategy_arguments():
    with pytest.raises(ValueError, match="unknown cohort strategy 'fast'"):
        CohortEngine(lambda s, c: (c, c), "fast")
    with pytest.raises(ValueError, match="chunk_size >= 1"):
        CohortEngine(lambda s, c: (c, c), "chunked", 0)


MESH_SCRIPT = textwrap.dedent("""
    import jax, numpy as np, sys
    sys.path.insert(0, {tests!r})
    from test_cohort import make_problem, python_loop
    from fedjax_dp.core.cohort import CohortEngine, client_mesh
    assert len(jax.devices()) == 8, jax.devices()
    client_fn, params, clients = make_problem()  # 7 clients over 8 devices: padding exercised
    want, _ = python_loop(client_fn, params, clients)
    for strategy, chunk in (("vmap", None), ("chunked", 2), ("sequential", None)):
        for devices in (8, 2):
            engine = CohortEngine(client_fn, strategy, chunk, client_mesh(devices))
            got, loss = engine(params, clients)
            single, _ = CohortEngine(client_fn, strategy, chunk)(params, clients)
            leaves = jax.tree_util.tree_leaves
            for a, b, c in zip(leaves(got), leaves(want), leaves(single)):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
            assert loss.shape == (7,)
    print("MESH-OK")
""")


def test_device_mesh_equals_single_device():
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    script = MESH_SCRIPT.format(tests=os.path.dirname(__file__))
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert "MESH-OK" in out.stdout, out.stderr[-3000:]


def test_chunked_memory_does_not_copy_the_cohort():
    """Issue 20: a cohort that is not a multiple of the chunk was padded by gathering a copy of all
    its data (at 10^4 CNN clients on an H100, 1.9 GB). Temporaries must stay chunk-sized: XLA's
    memory analysis of the compiled program, cohort of 1001 clients of 4000 floats, chunks of 50."""

    def client_fn(shared, client):
        return client["x"] * shared, jnp.sum(client["x"])

    engine = CohortEngine(client_fn, "chunked", 50)
    clients = {"x": jax.ShapeDtypeStruct((1001, 4000), jnp.float32)}
    compiled = jax.jit(engine.trace).lower(jax.ShapeDtypeStruct((), jnp.float32), clients).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    cohort_bytes = 1001 * 4000 * 4
    assert temp < cohort_bytes / 4, (temp, cohort_bytes)


LOOP_DEVICES_SCRIPT = textwrap.dedent("""
    import jax, numpy as np, sys
    sys.path.insert(0, {tests!r})
    import fedjax_dp
    fedjax_dp.use_a_device_per_core()  # one CPU device per FEDJAX_DP_CPU_DEVICES, before JAX starts
    from test_cohort import make_problem
    from fedjax_dp.core.cohort import CohortEngine, client_mesh
    devices = jax.devices()
    assert len(devices) == 3, devices
    # 7 clients
    client_fn, params, clients = make_problem("cnn_pfl", shape=(8, 8, 3), conv_impl="per_layer")
    one = CohortEngine(client_fn, "loop")(params, clients)
    spread = CohortEngine(client_fn, "loop", devices=tuple(devices))(params, clients)
    for a, b in zip(jax.tree_util.tree_leaves(one), jax.tree_util.tree_leaves(spread)):
        np.testing.assert_array_equal(a, b)  # the sums added in client order: the same bits
        assert b.devices() == {{devices[0]}}, b.devices()

    broken = np.asarray(jax.random.key_data(clients["key"][4]))

    def refuse_client_4(key_data):
        if np.array_equal(key_data, broken):
            raise RuntimeError("client 4 is broken")

    def fails_on_client_4(shared, client):  # raises at run time, on the second device (4 % 3)
        jax.debug.callback(refuse_client_4, jax.random.key_data(client["key"]))
        return client_fn(shared, client)

    def failed(shared, client):
        summed, loss = jax.eval_shape(client_fn, shared, client)
        zeros = jax.tree_util.tree_map(lambda s: jax.numpy.zeros(s.shape, s.dtype), summed)
        return zeros, jax.numpy.float32(-1)

    engine = CohortEngine(fails_on_client_4, "loop", failed_fn=failed, devices=tuple(devices))
    got, loss = engine(params, clients)
    others = [0, 1, 2, 3, 5, 6]
    assert float(loss[4]) == -1 and (np.asarray(loss)[others] == np.asarray(one[1])[others]).all()
    # a mesh given a state committed to one device (a restored checkpoint's): accepted, outputs on
    # the first device
    meshed = CohortEngine(client_fn, "sequential", mesh=client_mesh(3))(
        jax.device_put(params, devices[1]), clients)
    for a, b in zip(jax.tree_util.tree_leaves(meshed), jax.tree_util.tree_leaves(one)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert a.devices() == {{devices[0]}}, a.devices()
    # spreading copies the shared inputs onto every device; past max_replicated_bytes the cohort
    # stays on one
    moved, real_put = [], jax.device_put
    jax.device_put = lambda x, device=None, *a, **k: (
        moved.append((x, device)) or real_put(x, device, *a, **k))
    try:
        limited = CohortEngine(client_fn, "loop", devices=tuple(devices), max_replicated_bytes=100)
        kept = limited(params, clients)
        assert not any(x is params for x, _ in moved), "the shared inputs were copied elsewhere"
        spreading = CohortEngine(client_fn, "loop", devices=tuple(devices))
        spreading(params, clients)  # under the default limit: spread
        assert any(x is params and d == devices[1] for x, d in moved)
        # what a run's summary records
        assert limited.ran_on_one_device and not spreading.ran_on_one_device
    finally:
        jax.device_put = real_put
    for a, b in zip(jax.tree_util.tree_leaves(kept), jax.tree_util.tree_leaves(one)):
        np.testing.assert_array_equal(a, b)
    meshed = CohortEngine(client_fn, "sequential", mesh=client_mesh(3), max_replicated_bytes=100)
    unmeshed = meshed(params, clients)
    assert meshed.ran_on_one_device
    plain = CohortEngine(client_fn, "sequential")(params, clients)
    for a, b in zip(jax.tree_util.tree_leaves(unmeshed), jax.tree_util.tree_leaves(plain)):
        np.testing.assert_array_equal(a, b)  # the one-device program, not the mesh's psum
    print("LOOP-DEVICES-OK")
""")


def test_loop_over_devices_equals_one_device_bit_for_bit_and_contains_a_raising_client():
    """``loop`` with ``devices``: clients round-robin on three CPU devices (7 clients: the last
    round partial), a conv model; the sums and per-client rows are the one-device loop's exactly, on
    the first device; a client that raises on the second device is replaced by its failed outputs,
    the others count. A mesh takes a state committed to one device (it refused it: "incompatible
    devices") and returns to the first. Shared inputs whose copies would pass
    ``max_replicated_bytes`` are not copied: the cohort runs on one device (Table 7's 8 GB random
    matrix was copied to the second core's device: 21.6 GB peak)."""
    env = dict(os.environ, FEDJAX_DP_CPU_DEVICES="3", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    script = LOOP_DEVICES_SCRIPT.format(tests=os.path.dirname(__file__))
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert "LOOP-DEVICES-OK" in out.stdout, out.stderr[-3000:]
    # said once a process, though both engines ran on one device (a run builds an engine per set of
    # compression rates)
    assert out.stderr.count("running on one device") == 1, out.stderr[-3000:]


def test_devices_are_for_the_loop_strategy():
    with pytest.raises(ValueError, match="devices= spreads strategy 'loop'"):
        CohortEngine(lambda s, c: (c, c), "sequential", devices=tuple(jax.devices()))


def test_an_engine_stays_frozen_and_keeps_what_its_calls_observed_apart():
    """Issue 73 item 7: ``ran_on_one_device`` was written onto the frozen engine with
    ``object.__setattr__``; it is now an ``EngineRecord`` of its own, not part of the engine's
    identity, fresh for each engine."""
    import dataclasses as dc

    engine = CohortEngine(lambda s, c: (c, c), "vmap")
    with pytest.raises(dc.FrozenInstanceError):
        engine.strategy = "loop"
    other = dc.replace(engine)
    engine.observed.ran_on_one_device = True
    assert engine.ran_on_one_device and not other.ran_on_one_device and engine == other
