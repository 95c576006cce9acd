"""The shipped DP configs keep their privacy numbers: the noise multiplier each runs with
(calibrated where it says so) and the epsilon its ledger reports after its rounds, equal to the
recorded ones (``tests/golden/shipped.py``; recorded before accounting became event-based, equal to
the bit after it)."""

from __future__ import annotations

import json

import pytest

from tests.golden.shipped import FILE, SHIPPED, numbers

SLOW = ("geyer_mnist:1000:poisson",)  # a PLD budget check before each of 1,000 rounds


@pytest.mark.parametrize(
    "spec", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in SHIPPED]
)
def test_a_shipped_config_keeps_its_calibration_and_epsilon(spec):
    with open(FILE) as f:
        recorded = json.load(f)[spec]
    assert numbers(spec) == recorded
