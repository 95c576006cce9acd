"""Prints the statistics of a config's federated dataset and plots its label distribution,
without training: check a partition before spending compute on it.

    python experiments/describe_data.py --config fedavg_mnist \
        --config.data.source=cifar10 --config.data.data_dir=../shared/data/cifar10 \
        --config.data.partition=alid --config.data.classes_per_client=3 --plot labels.png
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from fedjax_dp.data.builders import build_dataset
from fedjax_dp.data.describe import describe, plot_label_distribution

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    os.path.join("experiments", "configs", "fedavg_mnist.py"),
    "Experiment config file (ml_collections).",
)
_PLOT = flags.DEFINE_string("plot", "", "Write the label-distribution plot (PNG) here.")


def _main(argv):
    del argv
    cfg = _CONFIG.value
    try:
        dataset = build_dataset(cfg.data, cfg.seed)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(describe(dataset))
    if _PLOT.value:
        print("plot:", plot_label_distribution(dataset, _PLOT.value))
    return 0


if __name__ == "__main__":
    app.run(_main)
