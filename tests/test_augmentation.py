"""``data.augment='crop_flip'``: random crop after black padding of 4 and horizontal flip of every
drawn training image (data/augmentation.py), as PFLDyn's authors' torchvision pipeline does."""

import numpy as np
import pytest

from fedjax_dp.data.augmentation import PADDING, apply_crop_flip, augment_batches, crop_flip_draws
from fedjax_dp.data.builders import build_dataset
from fedjax_dp.data.normalization import CHANNEL_STATS, standardized_black
from fedjax_dp.training.cohorts import make_packer
from fedjax_dp.training.config_validation import validate_config
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment
from fixture_files import make_cifar_dir


def _reference(images, dy, dx, flip, fill):
    """torchvision's RandomCrop(padding=p) + RandomHorizontalFlip by hand: pad, slice, mirror, one
    image at a time."""
    out = []
    for image, sy, sx, mirrored in zip(images, dy, dx, flip):
        padded = np.pad(image, ((PADDING, PADDING), (PADDING, PADDING), (0, 0)))
        padded[:PADDING], padded[-PADDING:], padded[:, :PADDING], padded[:, -PADDING:] = (
            fill,
            fill,
            fill,
            fill,
        )
        h, w = image.shape[:2]
        crop = padded[PADDING + sy : PADDING + sy + h, PADDING + sx : PADDING + sx + w]
        out.append(crop[:, ::-1] if mirrored else crop)
    return np.stack(out)


def test_crop_and_flip_equal_padding_slicing_and_mirroring_by_hand():
    rng = np.random.default_rng(0)
    images = rng.normal(size=(200, 8, 10, 3)).astype(np.float32)
    dy, dx, flip = crop_flip_draws(np.random.default_rng(1), len(images))
    assert (
        dy.min() == dx.min() == -PADDING and dy.max() == dx.max() == PADDING and 0 < flip.mean() < 1
    )
    fill = np.array([-1.5, 0.25, 2.0], np.float32)  # a per-channel black, as after standardisation
    np.testing.assert_array_equal(
        apply_crop_flip(images, dy, dx, flip, fill), _reference(images, dy, dx, flip, fill)
    )
    still = apply_crop_flip(
        images, np.zeros(200, int), np.zeros(200, int), np.zeros(200, bool), 0.0
    )
    np.testing.assert_array_equal(still, images)  # no shift, no flip: the images themselves
    batch = images.reshape(4, 5, 10, 8, 10, 3)  # (clients, steps, batch, H, W, C)
    assert augment_batches(batch, np.random.default_rng(2), 0.0).shape == batch.shape


def test_the_black_fill_is_what_standardisation_makes_of_zero():
    mean, std = (np.asarray(v) for v in CHANNEL_STATS["cifar10"])
    np.testing.assert_allclose(standardized_black("cifar10"), (0 - mean) / std, rtol=1e-6)


def test_the_packer_augments_drawn_training_batches_only_and_a_run_trains(tmp_path):
    make_cifar_dir(tmp_path, n_train=40, n_test=20)
    c = default_config()
    c.algorithm, c.rounds, c.eval_every, c.model.name = "fedavg", 2, 2, "cnn_pfl"
    c.data.update(
        source="cifar10",
        data_dir=str(tmp_path),
        partition="iid_split",
        num_clients=4,
        cache_dir="off",
        augment="crop_flip",
    )
    c.client.update(batch_size=5, epochs=1)
    c.sampling.cohort_size = 2
    dataset = build_dataset(c.data, c.seed)
    from fedjax_dp.core.algorithm import Requirements

    plain, augmented = (
        make_packer(cfg, dataset, Requirements()) for cfg in (_without_augment(c), c)
    )
    a, b = (
        plain([0, 1], np.random.default_rng(3), None),
        augmented([0, 1], np.random.default_rng(3), None),
    )
    # the same draws, then cropped and flipped
    np.testing.assert_array_equal(a["batches"]["y"], b["batches"]["y"])
    assert a["batches"]["x"].shape == b["batches"]["x"].shape and not np.array_equal(
        a["batches"]["x"], b["batches"]["x"]
    )
    # black borders from the padding
    assert (b["batches"]["x"] == 0).any() and not (a["batches"]["x"] == 0).all()
    summary = run_experiment(c, str(tmp_path / "run"), progress=False)
    assert (
        summary.rounds == 2
        and summary.dropped_updates == 0
        and np.isfinite(summary.final["test_loss"])
    )


def _without_augment(c):
    plain = c.copy_and_resolve_references()
    plain.data.augment = "none"
    return plain


def test_augmenting_digits_or_an_unknown_mode_is_refused_before_any_data_is_read():
    c = default_config()  # mnist_5k
    c.data.augment = "crop_flip"
    with pytest.raises(
        ValueError,
        match=r"data.augment='crop_flip' crops and mirrors natural images: .* not "
        r"data.source='mnist_5k'",
    ):
        validate_config(c)
    c.data.augment = "mixup"
    with pytest.raises(ValueError, match="data.augment 'mixup' unknown"):
        validate_config(c)
