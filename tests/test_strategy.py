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
