"""``auto`` resolves to the measured formulation, and explicit engine settings are kept."""

from fedjax_dp.core.cohort import STRATEGIES
from fedjax_dp.core.strategy import choose_strategy
from fedjax_dp.models.conv import CONV_IMPLS
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.build import resolve_engine


def test_cpu_choices_follow_the_measurements():
    conv = choose_strategy(has_conv=True, cohort_size=100, backend="cpu")
    assert (conv.strategy, conv.unroll, conv.conv_impl) == ("sequential", 1, "im2col")
    dense = choose_strategy(has_conv=False, cohort_size=1000, backend="cpu")
    assert (dense.strategy, dense.unroll) == ("sequential", True)


def test_accelerator_choice_is_chunked_vmap_with_bounded_chunks():
    gpu = choose_strategy(has_conv=True, cohort_size=1000, backend="gpu")
    assert (gpu.strategy, gpu.chunk_size, gpu.unroll, gpu.conv_impl) == ("chunked", 256, True, "im2col")
    tpu = choose_strategy(False, 10, "tpu")
    assert (tpu.chunk_size, tpu.conv_impl) == (10, "xla")
    assert gpu.strategy in STRATEGIES and gpu.conv_impl in CONV_IMPLS


def test_explicit_engine_values_override_auto():
    cfg = default_config()
    cfg.engine.strategy, cfg.engine.chunk_size, cfg.engine.unroll, cfg.engine.conv_impl = "chunked", 7, "3", "xla"
    choice = resolve_engine(cfg, has_conv=True, cohort_size=50)
    assert (choice.strategy, choice.chunk_size, choice.unroll, choice.conv_impl) == ("chunked", 7, 3, "xla")
    cfg.engine.unroll = "full"
    assert resolve_engine(cfg, True, 50).unroll is True


def test_a_loop_free_conv_client_runs_unrolled_with_each_layers_fastest_conv_on_cpu():
    """Issue 20 (2026-11-26): without a loop XLA's convolutions are not slowed down, so a conv client of at
    most ``MAX_UNROLLED_CONV_STEPS`` steps runs one client at a time, fully unrolled, each layer by its shape;
    longer, or unknown, local training keeps the scan with im2col."""
    from fedjax_dp.core.strategy import MAX_UNROLLED_CONV_STEPS

    short = choose_strategy(True, 10, "cpu", loop_free_steps=25)
    assert (short.strategy, short.unroll, short.conv_impl) == ("loop", True, "per_layer")
    for steps in (MAX_UNROLLED_CONV_STEPS + 1, None):
        long = choose_strategy(True, 10, "cpu", loop_free_steps=steps)
        assert (long.strategy, long.unroll, long.conv_impl) == ("sequential", 1, "im2col")
    assert choose_strategy(False, 10, "cpu", loop_free_steps=5).strategy == "sequential"  # dense: unchanged
    assert choose_strategy(True, 10, "gpu", loop_free_steps=5).strategy == "chunked"  # GPU: unchanged


def test_loop_free_steps_come_from_the_algorithms_requirements():
    from fedjax_dp.core.algorithm import Requirements
    from fedjax_dp.training.build import loop_free_steps

    cfg = default_config()
    cfg.client.update(epochs=2, batch_size=10)
    sizes = [35, 60, 12]
    assert loop_free_steps(cfg, Requirements(), sizes) == 2 * 6  # epochs x batches of the largest client
    assert loop_free_steps(cfg, Requirements(sampled_steps=25, batches_per_step=2), sizes) == 25
    assert loop_free_steps(cfg, Requirements(evaluation_pass=True), sizes) is None  # UGA: a scan over its data
    cfg.engine.num_devices = 2
    assert loop_free_steps(cfg, Requirements(), sizes) is None  # a mesh: one program, no per-client calls
    cfg.engine.num_devices, cfg.fedmeta.enabled = 0, True
    assert loop_free_steps(cfg, Requirements(), sizes) is None  # FedMeta's server steps: a scan


def test_a_run_builds_the_engine_its_algorithm_allows(tmp_path):
    """``build_model_and_round`` (what ``run_experiment`` uses): CUAG-PFL's P = 25 steps run unrolled per
    client with per-layer convolutions on a CPU; the same model under UGA (a scan over its evaluation
    batches) keeps the scan with im2col; an explicit engine setting is kept."""
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
    assert (choice.strategy, choice.unroll, choice.conv_impl) == ("loop", True, "per_layer")
    assert model.module.conv_impl == "per_layer" and runner.strategy == "loop"
    uga = cfg.copy_and_resolve_references()
    uga.algorithm, uga.compression.enabled = "uga", False
    assert build_model_and_round(uga, dataset)[0].conv_impl == "im2col"
    cfg.engine.update(strategy="sequential", unroll="1", conv_impl="im2col")
    assert build_model_and_round(cfg, dataset)[0] == resolve_engine(cfg, True, 2)
