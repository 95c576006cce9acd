"""The ``fedjax-dp`` command: run an experiment config, with ml_collections overrides.

    fedjax-dp --config experiments/configs/<config>.py --config.rounds=20 --workdir results/run1

Without ``--config`` it runs ``training/default_config.py`` (the embedded-MNIST main job), from any folder.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app, flags
from ml_collections import config_flags

from fedjax_dp.training.loop import format_summary, run_experiment

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "training", "default_config.py")

_CONFIG = config_flags.DEFINE_config_file("config", DEFAULT_CONFIG, "Experiment config file (ml_collections).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Results directory (default: results/<config>-<time>).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace the results of an earlier run in --workdir.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue the run in --workdir from its newest checkpoint.")


def _main(argv):
    del argv
    cfg = _CONFIG.value
    workdir = _WORKDIR.value or os.path.join(
        "results", f"{cfg.algorithm}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        summary = run_experiment(cfg, workdir, overwrite=_OVERWRITE.value, progress=_PROGRESS.value,
                                 resume=_RESUME.value)
    except (ValueError, FileExistsError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    return 0


def main():
    app.run(_main)


if __name__ == "__main__":
    main()
