"""Privacy: upload transforms that state their typed releases (clipping, Gaussian noise), client
samplers that carry their own accounting event, accountants on Google's ``dp_accounting`` (RDP, PLD,
calibration), Gaussian DP, budget rules, the ledgers and the one tracker that composes what ran, the
``privacy`` config section (``PrivacySettings``), the report, auditing and release checks.

Sampling and accounting from one object, so they cannot be mismatched::

    sampler = PoissonSampling(num_clients=1000, rate=0.1)
    z = sampler.calibrate(target_epsilon=8.0, delta=1e-5, rounds=50)
    accountant = Accountant("pld").compose(sampler.round_event(z), count=50)

Correlated noise (DP-FTRL, banded / BLT matrix factorization) under a participation scheme the
sampler enforces::

    participation = Participation("min_separation", min_separation=4)
    plan = NoisePlan(noise_strategies.build("blt", 100, participation), participation,
    noise_multiplier=1.0) noise = CorrelatedNoise(plan)  # an upload transform: chain(FlatClip(S),
    noise, fixed_denominator(m))
"""

from fedjax_dp.privacy.accounting.accountant import (
    Accountant,
    RoundEvent,
    UnsupportedEventError,
    epsilon_of,
)
from fedjax_dp.privacy.accounting.calibration import (
    analytic_gaussian_sigma,
    calibrate,
    calibrate_noise_multiplier,
)
from fedjax_dp.privacy.accounting.events import register_event
from fedjax_dp.privacy.sampling import (
    FixedSizeSampling,
    ParticipationSampling,
    PoissonSampling,
    register_sampler,
)
from fedjax_dp.privacy.sampling import build as client_sampler
from fedjax_dp.privacy.correlated import strategies as noise_strategies
from fedjax_dp.privacy.correlated.participation import Participation
from fedjax_dp.privacy.correlated.plan import NoisePlan
from fedjax_dp.privacy.accounting.gdp import delta_from_mu, epsilon_from_mu, mu_clt, mu_from_epsilon
from fedjax_dp.privacy.audit.canary import audit_training_run, epsilon_lower_bound
from fedjax_dp.privacy.audit.release_check import ReleaseCheck, check_upload_noise
from fedjax_dp.privacy.ledgers.budget import BudgetRule, ClientBook
from fedjax_dp.privacy.ledgers.client_level import CentralLedger, Ledger, LocalLedger
from fedjax_dp.privacy.ledgers.correlated import CorrelatedLedger

# registers distributed DP's accounting events
from fedjax_dp.privacy import distributed  # noqa: F401

# registers the privacy rules of every chain
from fedjax_dp.privacy.mechanisms import chain_rules  # noqa: F401
from fedjax_dp.privacy.mechanisms.update_statistics import UpdateStatistics
from fedjax_dp.privacy.mechanisms.upload_clipping import (
    AdaptiveQuantileClip,
    FlatClip,
    MedianClip,
    PerLayerClip,
)
from fedjax_dp.privacy.mechanisms.upload_correlated_noise import CorrelatedNoise
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
from fedjax_dp.privacy.report import PrivacyReport
from fedjax_dp.privacy.settings import PrivacySettings
from fedjax_dp.privacy.tracker import PrivacyTracker, tracker_for

__all__ = [
    "Accountant",
    "RoundEvent",
    "analytic_gaussian_sigma",
    "calibrate_noise_multiplier",
    "calibrate",
    "register_event",
    "UnsupportedEventError",
    "epsilon_of",
    "audit_training_run",
    "epsilon_lower_bound",
    "BudgetRule",
    "ClientBook",
    "FixedSizeSampling",
    "PoissonSampling",
    "client_sampler",
    "register_sampler",
    "delta_from_mu",
    "epsilon_from_mu",
    "mu_clt",
    "mu_from_epsilon",
    "CentralLedger",
    "Ledger",
    "LocalLedger",
    "PrivacyReport",
    "PrivacySettings",
    "PrivacyTracker",
    "tracker_for",
    "ReleaseCheck",
    "check_upload_noise",
    "UpdateStatistics",
    "AdaptiveQuantileClip",
    "FlatClip",
    "MedianClip",
    "PerLayerClip",
    "GaussianNoise",
    "CorrelatedNoise",
    "CorrelatedLedger",
    "NoisePlan",
    "Participation",
    "ParticipationSampling",
    "noise_strategies",
]
