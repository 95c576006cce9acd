"""experiments/seed004_fig7.py: every run it makes is a valid config for both datasets and all six
splits, and CUAG-PFL's reduction is read against the uncompressed run of the same dataset (measured
on one split)."""

from types import SimpleNamespace

import pytest

from conftest import load_experiment
from fedjax_dp.training.config_validation import validate_config


@pytest.fixture(scope="module")
def fig7():
    return load_experiment("seed004_fig7")


@pytest.mark.parametrize("source", ["cifar10", "cifar100"])
def test_every_run_is_a_valid_config(fig7, source):
    args = SimpleNamespace(
        rounds=3, seed=0, eval_every=3, source=source, data_dir=f"/data/{source}"
    )
    for split in fig7.SPLITS:
        for _, overrides in fig7.METHODS:
            cfg = fig7.configure(args, {**fig7.split_overrides(split), **overrides})
            validate_config(cfg)
            assert cfg.data.source == source and cfg.data.classes_per_client == int(split[4:])


def test_reductions_pair_cuag_with_the_uncompressed_run_of_its_own_dataset(fig7, tmp_path):
    cuag, dense, scaffold = (m for m, _ in fig7.METHODS)
    rows = [
        {
            "source": "cifar10",
            "split": "acid3",
            "method": dense,
            "rounds": 3,
            "uplink_gb_300": 0.9,
            "total_gb_300": 1.8,
        },
        {
            "source": "cifar10",
            "split": "alid7",
            "method": cuag,
            "rounds": 3,
            "uplink_gb_300": 0.3,
            "total_gb_300": 1.2,
        },
        {
            "source": "cifar10",
            "split": "acid3",
            "method": scaffold,
            "rounds": 3,
            "uplink_gb_300": 1.6,
            "total_gb_300": 3.2,
        },
        {
            "source": "cifar100",
            "split": "alid7",
            "method": cuag,
            "rounds": 3,
            "uplink_gb_300": 0.2,
            "total_gb_300": 0.9,
        },
    ]
    rows.append(
        {
            "source": "cifar10",
            "split": "acid5",
            "method": cuag,
            "rounds": 3,
            "uplink_gb_300": 0.4,
            "total_gb_300": 1.3,
        }
    )
    reductions = fig7.reductions(rows)
    # cifar100 has no reference
    assert list(reductions) == [("cifar10", "alid7"), ("cifar10", "acid5")]
    # against cifar10's reference
    assert reductions[("cifar10", "alid7")] == pytest.approx((2 / 3, 1 / 3))
    assert reductions[("cifar10", "acid5")] == pytest.approx((5 / 9, 5 / 18))
    assert "| cifar10 | alid7 | 66.67% | 33.33% |" in fig7.markdown(rows)
    fig7.plot(rows, str(tmp_path / "fig7.png"))
    assert (tmp_path / "fig7.png").stat().st_size > 0
