"""The shipped DP configs' privacy numbers without training: the noise multiplier each one runs with
(calibrated where it says so) and the epsilon its ledger reports after its rounds, each round's
cohort drawn by its own sampler from a fixed generator (the same clients on any code). Computed from
the config, the sampler and the releases of the round the config builds on a stand-in model of its
source's shape; no data is loaded. ``python -m tests.golden.shipped`` rewrites
``data/shipped_privacy.json`` (only when a change of those numbers is intended; say why in the
commit and CHANGELOG.md)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from fedjax_dp import configs
from fedjax_dp.models import get_model
from fedjax_dp.privacy.settings import PrivacySettings
from fedjax_dp.privacy.tracker import tracker_for
from fedjax_dp.training.build import build_round, resolve_engine
from fedjax_dp.training.cohorts import expected_cohort, sample_cohort

HERE = os.path.dirname(os.path.abspath(__file__))
FILE = os.path.join(HERE, "data", "shipped_privacy.json")
SHIPPED = (
    "dp_fedavg_mnist",
    "geyer_mnist:100",
    "geyer_mnist:1000",
    "geyer_mnist:1000:poisson",
    "cuag_pfl_cifar10",
)
"""Every shipped config whose releases a tracker composes (``ldp_minibatch_mnist``'s ledger needs
the clients' data sizes: its numbers are the golden runs')."""
SHAPES = {"mnist_5k": ((28, 28, 1), 10), "mnist": ((28, 28, 1), 10), "cifar10": ((32, 32, 3), 10)}


def numbers(spec: str) -> dict:
    """{"noise_multipliers": the round-1 releases' z, "epsilon": after the config's rounds,
    "epsilons": each accountant's}."""
    cfg = configs.get(spec)
    shape, classes = SHAPES[cfg.data.source]
    model = get_model(cfg.model.name, shape, classes)
    clients = cfg.data.num_clients
    choice = resolve_engine(cfg, model.has_conv, int(expected_cohort(cfg, clients)))
    sizes = (500,) * clients  # a per-client calibration's client sizes (CUAG-PFL's paper mode)
    runner = build_round(cfg, model, choice, clients, client_sizes=sizes)
    releases = runner.uploads.releases(1)
    from fedjax_dp.privacy.sampling import build as client_sampler

    tracker = tracker_for(
        releases, PrivacySettings.from_config(cfg), client_sampler(cfg.sampling, clients)
    )
    rng = np.random.default_rng(0)
    for t in range(1, cfg.rounds + 1):
        releases = runner.uploads.releases(t)
        if not tracker.allows(t, releases):
            break
        ids = sample_cohort(cfg, clients, rng, tracker.eligible(t, releases), t)
        tracker.record(t, ids, releases)
    report = tracker.report()
    return {
        "noise_multipliers": [float(r.noise_multiplier) for r in runner.uploads.releases(1)],
        "rounds": tracker.rounds,
        "epsilon": float(report.epsilon),
        "epsilons": {k: float(v) for k, v in report.epsilons.items() if isinstance(v, float)},
    }


def main(specs) -> None:
    table = {spec: numbers(spec) for spec in specs or SHIPPED}
    with open(FILE, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
