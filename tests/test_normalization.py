"""``data.normalize='channel'``: per-channel standardisation with published constants
(data/normalization.py)."""

import os

import numpy as np
import pytest

from fedjax_dp.data.builders import build_dataset
from fedjax_dp.data.cifar_files import load_cifar10
from fedjax_dp.data.normalization import CHANNEL_STATS, standardize
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.default_config import default_config
from fixture_files import make_cifar_dir


def _data_cfg(data_dir, normalize):
    c = default_config()
    c.data.update(
        source="cifar10",
        data_dir=str(data_dir),
        partition="iid_split",
        num_clients=2,
        normalize=normalize,
        cache_dir="off",
    )
    return c


def test_channel_normalization_subtracts_the_published_mean_and_divides_by_the_std_per_channel(
    tmp_path,
):
    make_cifar_dir(tmp_path)
    raw = build_dataset(_data_cfg(tmp_path, "none").data, 0)
    normalized = build_dataset(_data_cfg(tmp_path, "channel").data, 0)
    mean, std = CHANNEL_STATS["cifar10"]
    for c in range(3):  # by hand, channel by channel
        want = (raw.x[..., c].astype(np.float64) - mean[c]) / std[c]
        np.testing.assert_allclose(normalized.x[..., c], want, rtol=1e-6, atol=1e-6)
    assert normalized.x.dtype == np.float32
    # same split
    assert [t.tolist() for t in normalized.client_train] == [t.tolist() for t in raw.client_train]
    np.testing.assert_array_equal(normalized.y, raw.y)


def test_a_source_without_constants_and_an_unknown_mode_are_refused_before_any_data_is_read(
    tmp_path,
):
    c = default_config()
    c.data.update(
        source="femnist",
        partition="natural",
        data_dir=str(tmp_path / "absent"),
        normalize="channel",
    )
    with pytest.raises(
        ValueError,
        match=r"data.normalize='channel' has published constants for .* not for "
        r"data.source='femnist'",
    ):
        validate_config(c)
    # the TFDS copy of a dataset with constants is accepted
    c.data.update(source="tfds:cifar100", partition="acid")
    validate_config(c)
    c = default_config()
    c.data.normalize = "zscore"
    with pytest.raises(ValueError, match=r"data.normalize 'zscore' unknown"):
        validate_config(c)
    with pytest.raises(ValueError, match="3 channel constants for inputs of shape"):
        standardize(np.zeros((2, 28, 28, 1), np.float32), "cifar10")


def test_the_cifar10_constants_are_those_of_the_real_training_images(shared_data_dir):
    x = load_cifar10(os.path.join(shared_data_dir, "cifar10"))[0]
    mean, std = CHANNEL_STATS["cifar10"]
    np.testing.assert_allclose(x.mean((0, 1, 2), dtype=np.float64), mean, atol=5e-5)
    np.testing.assert_allclose(x.std((0, 1, 2), dtype=np.float64), std, atol=5e-5)
