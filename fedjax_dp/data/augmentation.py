"""Training-image augmentation: ``data.augment = 'crop_flip'`` (random crop after zero padding, and
horizontal flip).

What PFLDyn's authors do to every CIFAR training image each time it is drawn (``alpemreacar/PFL``,
``utils_dataset.py``: torchvision ``RandomCrop(32, padding=4)`` then ``RandomHorizontalFlip()``,
then the per-channel standardisation); seed 004 does not say. Here it is applied on the host to
every drawn example of a packed cohort (``cohort["batches"]["x"]``: one fresh draw per local step,
so an example drawn twice gets two crops), with the run's host generator (checkpointed, so a resumed
run draws the same crops). Evaluation data is never augmented.

The padding is black, as torchvision pads the PIL image before it is standardised: ``fill`` is the
value a black pixel has in the arrays (0, or ``(0 - mean) / std`` per channel with
``data.normalize='channel'``). Augmentation only changes how a client's own examples are presented
to its local training, so it does not change any privacy accounting (each augmented copy is a
function of one example, used where that example is used).
"""

from __future__ import annotations

import numpy as np

AUGMENTATIONS = ("none", "crop_flip")
# natural images: a mirror is the same class
FLIPPABLE_SOURCES = ("cifar10", "cifar100", "tfds:cifar10", "tfds:cifar100")
PADDING = 4


def crop_flip_draws(rng: np.random.Generator, count: int, padding: int = PADDING):
    """Per image: the crop's shift (dy, dx), each uniform in [-padding, padding], and whether to
    flip."""
    shifts = rng.integers(-padding, padding + 1, size=(count, 2))
    return shifts[:, 0], shifts[:, 1], rng.random(count) < 0.5


def apply_crop_flip(
    images: np.ndarray, dy: np.ndarray, dx: np.ndarray, flip: np.ndarray, fill
) -> np.ndarray:
    """``out[i, r, c] = padded_i[r + dy_i + p, c + dx_i + p]`` (a crop of the image padded by
    ``fill``), then mirrored left-right where ``flip``. ``images`` is ``(N, H, W, C)``; ``fill`` a
    scalar or one value per channel."""
    count, height, width, _ = images.shape
    out = np.empty_like(images)
    out[...] = np.asarray(fill, images.dtype)
    for sy in np.unique(dy):
        for sx in np.unique(dx[dy == sy]):
            chosen = np.flatnonzero((dy == sy) & (dx == sx))
            r0, r1, c0, c1 = max(0, -sy), height - max(0, sy), max(0, -sx), width - max(0, sx)
            out[chosen, r0:r1, c0:c1] = images[chosen, r0 + sy : r1 + sy, c0 + sx : c1 + sx]
    out[flip] = out[flip, :, ::-1]
    return out


def augment_batches(x: np.ndarray, rng: np.random.Generator, fill, rows=None) -> np.ndarray:
    """Every image of a packed batch array ``(..., H, W, C)`` cropped and flipped independently.
    ``rows``: ``(slice, slots)`` where ``x`` holds only those of the cohort's slots (several hosts):
    the draws are made for every slot, as on one host, and those rows' are applied."""
    images = x.reshape((-1,) + x.shape[-3:])
    if rows is None:
        return apply_crop_flip(images, *crop_flip_draws(rng, len(images)), fill).reshape(x.shape)
    share, slots = rows
    per_slot = len(images) // (share.stop - share.start)
    draws = crop_flip_draws(rng, per_slot * slots)
    mine = slice(share.start * per_slot, share.stop * per_slot)
    return apply_crop_flip(images, *(d[mine] for d in draws), fill).reshape(x.shape)
