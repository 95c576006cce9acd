"""Datasets through ``tensorflow-datasets``: the path a user with internet takes.

Uses ``tfds.data_source`` (random-access ArrayRecord files, no TensorFlow needed) rather than
``tfds.load`` (which needs TensorFlow): the simulator keeps whole splits in memory as numpy
arrays, so a tf.data pipeline would add a heavy dependency for nothing. ``download=True`` runs
``download_and_prepare`` in ArrayRecord format (``manual_dir`` for datasets that need one);
``download=False`` reads an already prepared ``data_dir``. Offline tests use
``tfds.testing.mock_data``.
"""

from __future__ import annotations

import numpy as np

SUPPORTED = {  # name -> (image key, label key, number of classes)
    "mnist": ("image", "label", 10),
    "fashion_mnist": ("image", "label", 10),
    "cifar10": ("image", "label", 10),
    "cifar100": ("image", "label", 100),
    "emnist/byclass": ("image", "label", 62),
    "emnist/balanced": ("image", "label", 47),
    "emnist/digits": ("image", "label", 10),
    "emnist/letters": ("image", "label", 37),
}


def _records(source, chunk: int = 4096):
    n = len(source)
    for start in range(0, n, chunk):
        keys = list(range(start, min(n, start + chunk)))
        try:
            yield from source.__getitems__(keys)
        except (TypeError, AttributeError):  # sources without batched access (e.g. mocks)
            yield from (source[k] for k in keys)


def split_arrays(source, image_key: str, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Reads a whole split into ``(x float32 in [0, 1], y int32)``."""
    images, labels = [], []
    for record in _records(source):
        images.append(np.asarray(record[image_key]))
        labels.append(int(record[label_key]))
    if not images:
        raise ValueError("the TFDS split is empty")
    return np.stack(images).astype(np.float32) / 255.0, np.asarray(labels, dtype=np.int32)


def load_tfds(name: str, data_dir: str = "", download: bool = False, manual_dir: str = ""):
    """Returns ``(x_train, y_train, x_test, y_test, num_classes)`` for a supported TFDS dataset."""
    if name not in SUPPORTED:
        raise ValueError(
            f"TFDS dataset {name!r} is not supported; choose one of {sorted(SUPPORTED)}"
        )
    import tensorflow_datasets as tfds  # heavy import, only on this path

    image_key, label_key, num_classes = SUPPORTED[name]
    builder = tfds.builder(name, data_dir=data_dir or None)
    if download:
        config = tfds.download.DownloadConfig(manual_dir=manual_dir or None)
        builder.download_and_prepare(file_format="array_record", download_config=config)
    out = []
    for split in ("train", "test"):
        try:
            source = tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
        # tfds raises NotImplementedError when the split exists only as TFRecord (no random access),
        # KeyError
        # when its folder (the default one too) holds no generated split
        except (NotImplementedError, FileNotFoundError, AssertionError, KeyError) as e:
            raise FileNotFoundError(
                f"TFDS dataset {name!r} split {split!r} is not prepared in ArrayRecord format under"
                f" {builder.data_dir!r}; set data.download=True on a machine with internet (or"
                f" prepare it with `tfds build {name} --file_format=array_record`), or use a"
                " local-file source"
            ) from e
        out += split_arrays(source, image_key, label_key)
    return (*out, num_classes)
