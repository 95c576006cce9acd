"""The scorecard's "Does each paper's privacy claim hold?" (``experiments/README.md``): each figure
computed through the public API, and the patent's threshold read from the committed raw rows."""

import glob
import json
import math
import os

import pytest

from fedjax_dp.privacy import Accountant, FixedSizeSampling
from fedjax_dp.privacy.accounting import gdp
from fedjax_dp.privacy.mechanisms import adaptive_gdp

RAW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments", "raw_rows")

# Geyer et al. 2017 as the authors ran it: exactly m of K clients, z = 1, stop at epsilon 8 at Q.
GEYER = [  # K, m, Q, CR of the paper's Table 1, (RDP, PLD) one round, (RDP, PLD) to CR
    (100, 30, 1e-3, 11, (7.04, 5.60), (31.72, 16.96)),
    (1000, 100, 1e-5, 54, (7.70, 6.58), (49.98, 23.41)),
    (10000, 300, 1e-6, 412, (7.11, 5.93), (51.05, 25.71)),
]


@pytest.mark.parametrize("population, cohort, q, cr, one, to_cr", GEYER)
def test_geyer_epsilon_8_does_not_hold_for_fixed_size_sampling(
    population, cohort, q, cr, one, to_cr
):
    event = FixedSizeSampling(num_clients=population, cohort_size=cohort).round_event(1.0)
    for kind, first, later in zip(("rdp", "pld"), one, to_cr):
        assert round(Accountant(kind).compose(event).epsilon(q), 2) == first
        assert round(Accountant(kind).compose(event, count=cr).epsilon(q), 2) == later
    assert min(one) > 5 and min(to_cr) > 8  # one round is most of the budget; CR rounds exceed it


def test_geyer_one_round_matches_the_committed_raw_row():
    with open(os.path.join(RAW, "geyer_table1_k100_k1000_fixed_and_reference_seed0.json")) as f:
        runs = json.load(f)["runs"]
    fixed = {r["K"]: r for r in runs if r["variant"].startswith("DP, fixed m, RDP")}
    assert fixed[100]["CR"] == 1 and round(fixed[100]["epsilon"], 2) == 7.04
    assert fixed[1000]["CR"] == 1 and round(fixed[1000]["epsilon"], 2) == 7.70


def test_cuag_pfl_claim_of_0_92_is_exceeded_by_the_papers_own_formula():
    setting = dict(sampling_rate=0.1, batch_size=50, dataset_size=500, local_steps=25)
    eps = {
        t: gdp.epsilon_from_mu(adaptive_gdp.schedule_mu(t, 0.25, **setting), 1e-5)
        for t in (1, 10, 20, 300)
    }
    assert round(eps[1], 2) == 0.93  # the claim (0.92 in the paper)
    assert [round(eps[t], 2) for t in (10, 20, 300)] == [1.68, 1.88, 2.57]
    assert math.isclose(
        adaptive_gdp.schedule_mu(300, 0.25, **setting),
        0.25 * math.sqrt(sum(1 / t for t in range(1, 301))),
        rel_tol=1e-9,
    )


def _ldp_rows(obj):
    if isinstance(obj, dict):
        for row in obj.get("rows", []) if isinstance(obj.get("rows"), list) else []:
            if row.get("method") in ("ldp", "ldp_fixed", "ldp_mean", "ldp_poisson"):
                if row.get("epsilon") and row.get("epsilon_max") is not None:
                    yield row
        for key, value in obj.items():
            if key != "rows":
                yield from _ldp_rows(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _ldp_rows(value)


def test_the_patents_threshold_holds_in_every_seed003_raw_row():
    rows = []
    for path in glob.glob(os.path.join(RAW, "seed003_*.json")):
        with open(path) as f:
            rows.extend(_ldp_rows(json.load(f)))
    assert len(rows) == 256
    assert all(r["formal"] is True for r in rows)
    assert max(r["epsilon_max"] / r["epsilon"] for r in rows) <= 1.0
