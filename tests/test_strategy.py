"""``auto`` resolves to the measured formulation, and explicit engine settings are kept."""

import jax
import numpy as np
import pytest

from fedjax_dp.core.cohort import STRATEGIES
from fedjax_dp.core.strategy import choose_strategy
from fedjax_dp.models.conv import CONV_IMPLS
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.build import resolve_engine


def test_cpu_choices_follow_the_measurements():
    conv = choose_strategy(has_conv=True, cohort_size=100, backend="cpu")
    assert (conv.strategy, conv.unroll, conv.conv_impl) == ("sequential", 1, "im2col")
    dense = choose_strategy(has_conv=False, cohort_size=1000, backend="cpu")
    # spread over the cores, a scan is as fast, compiles faster
    assert (dense.strategy, dense.unroll) == ("sequential", 1)


def test_accelerator_choice_is_chunked_vmap_with_bounded_chunks():
    gpu = choose_strategy(has_conv=True, cohort_size=1000, backend="gpu")
    assert (gpu.strategy, gpu.chunk_size, gpu.unroll, gpu.conv_impl) == (
        "chunked",
        256,
        True,
        "im2col",
    )
    tpu = choose_strategy(False, 10, "tpu")
    assert (tpu.chunk_size, tpu.conv_impl) == (10, "xla")
    assert gpu.strategy in STRATEGIES and gpu.conv_impl in CONV_IMPLS


def test_explicit_engine_values_override_auto():
    cfg = default_config()
    cfg.engine.strategy, cfg.engine.chunk_size, cfg.engine.unroll, cfg.engine.conv_impl = (
        "chunked",
        7,
        "3",
        "xla",
    )
    choice = resolve_engine(cfg, has_conv=True, cohort_size=50)
    assert (choice.strategy, choice.chunk_size, choice.unroll, choice.conv_impl) == (
        "chunked",
        7,
        3,
        "xla",
    )
    cfg.engine.unroll = "full"
    assert resolve_engine(cfg, True, 50).unroll is True


def test_a_loop_free_conv_client_runs_unrolled_with_each_layers_fastest_conv_on_cpu():
    """Issue 20 (2026-11-26): without a loop XLA's convolutions are not slowed down, so a conv
    client of at most ``MAX_UNROLLED_CONV_STEPS`` steps runs one client at a time, fully unrolled,
    each layer by its shape; longer, or unknown, local training keeps the scan with im2col."""
    from fedjax_dp.core.strategy import MAX_UNROLLED_CONV_STEPS

    short = choose_strategy(True, 10, "cpu", loop_free_steps=25)
    # a client a core: XLA's convolution in every layer
    spread_over_cores = len(jax.devices("cpu")) > 1
    assert (short.strategy, short.unroll, short.conv_impl) == (
        "loop",
        True,
        "xla" if spread_over_cores else "per_layer",
    )
    for steps in (MAX_UNROLLED_CONV_STEPS + 1, None):
        long = choose_strategy(True, 10, "cpu", loop_free_steps=steps)
        assert (long.strategy, long.unroll, long.conv_impl) == ("sequential", 1, "im2col")
    # dense: unchanged
    assert choose_strategy(False, 10, "cpu", loop_free_steps=5).strategy == "sequential"
    # GPU: unchanged
    assert choose_strategy(True, 10, "gpu", loop_free_steps=5).strategy == "chunked"


def test_a_dp_sgd_conv_client_keeps_the_scan_with_im2col_on_cpu_and_the_dp_sgd_algorithms_say_so():
    """Per-example gradients (DP-SGD) of a conv model: a vmapped XLA convolution's per-example
    weight gradient is slow on XLA:CPU, im2col's is a batched matmul, so ``auto`` keeps the scan
    with im2col even for a loop-free client (measured, ``benchmarks/dp_sgd_engine.py``); dense
    models, the GPU and plain clients are unchanged."""
    from fedjax_dp.training.build import build_model_and_round
    from fedjax_dp.data.builders import build_dataset

    dp_sgd = choose_strategy(True, 10, "cpu", loop_free_steps=10, per_example=True)
    assert (dp_sgd.strategy, dp_sgd.unroll, dp_sgd.conv_impl) == ("sequential", 1, "im2col")
    assert choose_strategy(True, 10, "cpu", loop_free_steps=10).strategy == "loop"
    assert (
        choose_strategy(False, 10, "cpu", loop_free_steps=10, per_example=True).conv_impl == "xla"
    )
    assert (
        choose_strategy(True, 10, "gpu", loop_free_steps=10, per_example=True).strategy == "chunked"
    )
    cfg = default_config()
    cfg.data.num_clients, cfg.model.name, cfg.sampling.cohort_size = 6, "cnn_pfl", 2
    dataset = build_dataset(cfg.data, cfg.seed)
    for algorithm, per_example, engine in [
        ("ldp_minibatch", True, ("sequential", 1, "im2col")),
        ("dp_scaffold", True, ("sequential", 1, "im2col")),
        # clipped batch means
        ("ldp_minibatch", False, ("loop", True, "xla")),
    ]:
        cfg.algorithm, cfg.ldp.per_example = algorithm, per_example
        if algorithm == "dp_scaffold":
            cfg.ldp.per_example = True  # ldp's default: the section is not read
        choice, _, runner = build_model_and_round(cfg, dataset)
        assert runner.algorithm.requirements.per_example_gradients is per_example, algorithm
        # one device: the unrolled loop's convolutions are per layer
        if len(jax.devices("cpu")) > 1:
            assert (choice.strategy, choice.unroll, choice.conv_impl) == engine, (
                algorithm,
                per_example,
            )


def test_the_cpu_loop_spreads_over_every_cpu_device_and_explicit_num_devices_wins():
    """``auto``'s loop goes round-robin over the CPU devices (``core.host_devices``: one per core);
    an explicit ``engine.num_devices`` is kept; ``spread`` turns the count into the engine's
    ``devices`` (loop) or a mesh."""
    from fedjax_dp.core.host_devices import cpu_devices
    from fedjax_dp.core.strategy import StrategyChoice
    from fedjax_dp.training.build import spread

    assert choose_strategy(True, 10, "cpu", loop_free_steps=6).devices == len(cpu_devices())
    # the scan: a mesh over them
    assert choose_strategy(True, 10, "cpu").devices == len(cpu_devices())
    assert choose_strategy(False, 10, "cpu").devices == len(cpu_devices())
    assert choose_strategy(True, 10, "gpu").devices == 1
    cfg = default_config()
    assert resolve_engine(cfg, True, 10, loop_free_steps=6).devices == len(cpu_devices())
    cfg.engine.num_devices = 1
    assert resolve_engine(cfg, True, 10, loop_free_steps=6).devices == 1
    assert spread(StrategyChoice("loop", None, True, "per_layer", devices=1)) == {}
    n = len(jax.local_devices())
    with pytest.raises(ValueError, match=f"engine.num_devices={n + 1} but {n} local devices exist"):
        spread(StrategyChoice("loop", None, True, "per_layer", devices=n + 1))
    if n > 1:
        assert spread(StrategyChoice("loop", None, True, "per_layer", devices=2)) == {
            "devices": tuple(jax.local_devices()[:2])
        }
        assert spread(StrategyChoice("sequential", None, 1, "im2col", devices=2))["mesh"].shape == {
            "clients": 2
        }


def test_engine_max_replicated_gb_reaches_the_cohort_engine():
    """``engine.max_replicated_gb``: how many GB of copies of the shared inputs a spread may make
    (past it the engine runs on one device, ``tests/test_cohort.py``)."""
    from fedjax_dp.core.strategy import StrategyChoice
    from fedjax_dp.models import get_model
    from fedjax_dp.training.build import build_round

    cfg = default_config()
    cfg.engine.max_replicated_gb = 0.5
    runner = build_round(
        cfg, get_model("logistic", (4, 4, 1), 3), StrategyChoice("loop", None, True, "xla"), 10
    )
    assert runner._engine_options["max_replicated_bytes"] == 2**29


def test_local_steps_are_the_sampled_steps_or_epochs_times_the_largest_clients_batches():
    from fedjax_dp.core.algorithm import Requirements
    from fedjax_dp.training.build import local_steps

    cfg = default_config()
    cfg.client.update(epochs=2, batch_size=10)
    sizes = [35, 60, 12]
    # epochs x batches of the largest client
    assert local_steps(cfg, Requirements(), sizes) == 2 * 6
    assert local_steps(cfg, Requirements(sampled_steps=25, batches_per_step=2), sizes) == 25


def test_loops_left_finds_while_loops_and_scans_not_wholly_unrolled_wherever_they_are_nested():
    from fedjax_dp.core.loops import loops_left

    double = lambda c, _: (2 * c, None)  # noqa: E731
    assert (
        loops_left(
            jax.make_jaxpr(lambda x: jax.lax.scan(double, x, None, length=4, unroll=True)[0])(1.0)
        )
        == []
    )
    assert loops_left(
        jax.make_jaxpr(lambda x: jax.lax.scan(double, x, None, length=4, unroll=2)[0])(1.0)
    ) == ["scan of length 4 (unroll 2)"]
    in_jit_and_cond = jax.jit(
        lambda x: jax.lax.cond(
            x > 0, lambda y: jax.lax.fori_loop(0, 3, lambda i, c: c * 2, y), lambda y: y, x
        )
    )
    # fori_loop: a scan of length 3, unroll 1
    assert len(loops_left(jax.make_jaxpr(in_jit_and_cond)(1.0))) == 1
    dynamic = lambda x, n: jax.lax.fori_loop(0, n, lambda i, c: c * 2, x)  # noqa: E731
    assert loops_left(jax.make_jaxpr(dynamic)(1.0, 3)) == ["while"]
    inside_unrolled = lambda x: jax.lax.scan(
        lambda c, _: (jax.lax.fori_loop(0, 2, lambda i, d: d + 1, c), None),  # noqa: E731
        x,
        None,
        length=3,
        unroll=True,
    )[0]
    # unrolling the outer scan copies the inner loop
    assert len(loops_left(jax.make_jaxpr(inside_unrolled)(1.0))) == 1


@pytest.mark.parametrize(
    "algorithm, loop_free",
    [
        ("cuag_pfl", True),
        ("pfldyn_proto", True),
        ("fedavg", True),
        ("scaffold", True),
        ("dp_scaffold", True),
        ("uga", False),
        ("fedmeta", True),
    ],
)
def test_the_traced_loop_free_verdict_is_what_the_unrolled_client_program_lowers_to(
    algorithm, loop_free, tmp_path
):
    """``auto`` unrolls a conv model's steps on a CPU where ``client_program_is_loop_free`` finds no
    loop in the client program built with every step unrolled: traced, not declared. Checked against
    the lowered program (an unrolled scan lowers to straight-line code, a loop over the model to a
    ``stablehlo.while`` carrying floats): UGA's evaluation pass over its batches is a loop;
    FedMeta's steps on D_meta are the server's, not the client's."""
    from fedjax_dp.configs import cuag_pfl_cifar10
    from fedjax_dp.core.round import STEP_NOISE, client_inputs
    from fedjax_dp.core.strategy import StrategyChoice
    from fedjax_dp.data.builders import build_dataset, build_server_set
    from fedjax_dp.data.cifar_files import load_cifar_uint8
    from fedjax_dp.models import get_model
    from fedjax_dp.training.build import build_round, client_program_is_loop_free
    from fedjax_dp.training.cohorts import make_packer
    from fixture_files import make_cifar_dir

    make_cifar_dir(tmp_path, n_train=60, n_test=20)
    load_cifar_uint8.cache_clear()
    cfg = cuag_pfl_cifar10.get_config()
    cfg.data.update(data_dir=str(tmp_path), num_clients=3, cache_dir=str(tmp_path / "cache"))
    cfg.client.batch_size, cfg.sampling.cohort_size = 4, 2
    cfg.algorithm = "fedavg" if algorithm == "fedmeta" else algorithm
    cfg.compression.enabled = algorithm == "cuag_pfl"
    cfg.fedmeta.enabled = algorithm == "fedmeta"
    if algorithm == "dp_scaffold":
        cfg.dp_scaffold.local_steps = 3
    dataset, server_set = build_dataset(cfg.data, cfg.seed), None
    if algorithm == "fedmeta":
        server_set, dataset = build_server_set(cfg.data, cfg.server_data, dataset, cfg.seed)
    choice = StrategyChoice("loop", None, True, "per_layer")
    model = get_model(
        cfg.model.name, dataset.example_shape, dataset.num_classes, conv_impl=choice.conv_impl
    )
    runner = build_round(cfg, model, choice, dataset.num_clients, server_set, dataset.train_sizes())
    assert client_program_is_loop_free(cfg, dataset, model, runner) is loop_free
    requirements = runner.algorithm.requirements
    params = model.init(jax.random.key(0))
    cohort = make_packer(cfg, dataset, requirements)([0], np.random.default_rng(0), None)
    client = jax.tree_util.tree_map(lambda x: x[0], client_inputs(cohort, jax.random.key(1)))
    if requirements.step_noise:
        client[STEP_NOISE] = np.float32(1.0)
    state = runner.algorithm.client_state_init(params) if requirements.client_state else None
    program = (
        jax.jit(runner.algorithm.client_update)
        .lower(runner.algorithm.broadcast(runner.init(params)), client, state, client["key"])
        .as_text()
    )
    # a loop over the model carries floats; XLA's threefry lowering loops over its uint32 rounds
    # (not over the model)
    model_loops = [
        line for line in program.splitlines() if "stablehlo.while" in line and "f32" in line
    ]
    assert (not model_loops) is loop_free


def test_a_run_builds_the_engine_its_algorithm_allows(tmp_path):
    """``build_model_and_round`` (what ``run_experiment`` uses): CUAG-PFL's P = 25 steps run
    unrolled per client with per-layer convolutions on a CPU (XLA's in every layer when clients go a
    core each); the same model under UGA (a scan over its evaluation batches) keeps the scan with
    im2col; an explicit engine setting is kept."""
    import jax

    from fedjax_dp.configs import cuag_pfl_cifar10
    from fedjax_dp.data.builders import build_dataset
    from fedjax_dp.data.cifar_files import load_cifar_uint8
    from fedjax_dp.training.build import build_model_and_round
    from fixture_files import make_cifar_dir

    if jax.default_backend() != "cpu":
        return
    make_cifar_dir(tmp_path, n_train=60, n_test=20)
    load_cifar_uint8.cache_clear()
    cfg = cuag_pfl_cifar10.get_config()
    cfg.data.update(data_dir=str(tmp_path), num_clients=3, cache_dir=str(tmp_path / "cache"))
    cfg.client.batch_size, cfg.sampling.cohort_size = 4, 2
    dataset = build_dataset(cfg.data, cfg.seed)
    choice, model, runner = build_model_and_round(cfg, dataset)
    # a client a core, or one threaded over all
    conv = "xla" if len(jax.devices("cpu")) > 1 else "per_layer"
    assert (choice.strategy, choice.unroll, choice.conv_impl) == ("loop", True, conv)
    assert model.module.conv_impl == conv and runner.strategy == "loop"
    uga = cfg.copy_and_resolve_references()
    uga.algorithm, uga.compression.enabled = "uga", False
    assert build_model_and_round(uga, dataset)[0].conv_impl == "im2col"
    cfg.engine.update(strategy="sequential", unroll="1", conv_impl="im2col")
    assert build_model_and_round(cfg, dataset)[0] == resolve_engine(cfg, True, 2)
