"""A reviewer's first check (``docs/tff_check.md``): the setting of TensorFlow Federated's tutorial
"Differential Privacy in TFF" (Poisson sampling of 50 of 3,383 EMNIST clients, 100 rounds) through
the public API, against dp_accounting 0.6.0 called directly."""

import dp_accounting
import pytest

from fedjax_dp.privacy import Accountant, PoissonSampling, calibrate_noise_multiplier

CLIENTS, ROUNDS = 3383, 100
RDP_1E5 = {0.5: 9.81, 0.75: 3.22, 1.0: 1.50}
PLD_1E5 = {0.5: 8.06, 0.75: 2.51, 1.0: 1.06}
PLD_1E4 = {0.5: 6.36, 0.75: 1.85, 1.0: 0.80}


def epsilon(per_round: float, z: float, kind: str, delta: float) -> float:
    sampler = PoissonSampling(num_clients=CLIENTS, rate=per_round / CLIENTS)
    return Accountant(kind).compose(sampler.round_event(z), count=ROUNDS).epsilon(delta)


@pytest.mark.parametrize("z", sorted(RDP_1E5))
def test_epsilon_of_50_clients_a_round_for_100_rounds(z):
    assert round(epsilon(50, z, "rdp", 1e-5), 2) == RDP_1E5[z]
    assert round(epsilon(50, z, "pld", 1e-5), 2) == PLD_1E5[z]
    assert round(epsilon(50, z, "pld", 1e-4), 2) == PLD_1E4[z]


def test_the_rdp_figures_are_dp_accountings_own():
    for z, expected in RDP_1E5.items():
        direct = dp_accounting.rdp.RdpAccountant()
        event = dp_accounting.GaussianDpEvent(z)
        direct.compose(dp_accounting.PoissonSampledDpEvent(50 / CLIENTS, event), ROUNDS)
        assert round(direct.get_epsilon(1e-5), 2) == expected
        assert abs(direct.get_epsilon(1e-5) - epsilon(50, z, "rdp", 1e-5)) < 1e-9


def test_clients_per_round_for_epsilon_2_at_z_1_2_is_120():
    within = [m for m in range(100, 141) if epsilon(m, 1.2, "rdp", 1e-5) <= 2.0]
    assert max(within) == 120 and round(epsilon(120, 1.2, "rdp", 1e-5), 3) == 1.986
    assert epsilon(121, 1.2, "rdp", 1e-5) > 2.0
    # the same question the other way round: at 120 a round, epsilon 2 needs z just under 1.2
    z = calibrate_noise_multiplier(2.0, 1e-5, ROUNDS, "poisson", sampling_rate=120 / CLIENTS)
    assert 1.19 < z <= 1.2
