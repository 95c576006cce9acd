"""The accounting events of distributed DP, registered with the project's accountants
(``privacy.accounting.events``): RDP of one round, unsampled and Poisson-subsampled. Both are stated
in the scaled integer domain the noise is added in (sensitivities after scaling by 1 / gamma and
rounding, noise in integer units); no PLD is known for either, so a run accounts them by RDP.

* ``DistributedDiscreteGaussianDpEvent``: the sum of n discrete Gaussian shares N_Z(0, sigma^2) is
  close to N_Z(0, n sigma^2) (Kairouz, Liu and Steinke 2021, Thm. 1), with the inflation
  tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)); its RDP at order alpha is (ibid.,
  Prop. 14) min(alpha/2 l2^2 + tau d, alpha/2 (l2^2 + 2 l1 tau + tau^2 d), alpha/2 (l2 + sqrt(d)
  tau)^2), with l2 = Delta_2 / (sqrt(n) sigma), l1 = Delta_1 / (sqrt(n) sigma), d the dimension.
* ``SkellamDpEvent``: Skellam noise of variance mu on an integer query of sensitivities Delta_2,
  Delta_1 (Agarwal, Kairouz and Liu 2021, Thm. 3.5): alpha Delta_2^2 / (2 mu) + min(((2 alpha - 1)
  Delta_2^2 + 6 Delta_1) / (4 mu^2), 3 Delta_1 / (2 mu)).

Poisson subsampling at rate q: Zhu and Wang 2019 ("Poisson subsampled Renyi differential privacy",
Thm. 5), at each integer order alpha >= 2: eps_q(alpha) <= 1/(alpha-1) log((1-q)^(alpha-1)
(alpha q - q + 1) + C(alpha,2) q^2 (1-q)^(alpha-2) e^eps(2) + 3 sum_{l=3}^alpha C(alpha,l)
(1-q)^(alpha-l) q^l e^((l-1) eps(l))), and never more than the unsampled eps(alpha); a fractional
order gets the unsampled figure (valid, unamplified).
"""

from __future__ import annotations

import math

import attr
import dp_accounting
import numpy as np
from scipy import special

from fedjax_dp.privacy.accounting.events import register_event


@attr.define(frozen=True)
class DistributedDiscreteGaussianDpEvent(dp_accounting.DpEvent):
    """One round of the distributed discrete Gaussian: ``local_std`` sigma of each of at least
    ``clients`` surviving shares (the sum's privacy), ``tau_clients`` the most shares whose sum the
    inflation tau is computed for, ``dim`` d, sensitivities in the scaled integer domain."""

    l2_sensitivity: float
    l1_sensitivity: float
    local_std: float
    clients: int
    tau_clients: int
    dim: int


@attr.define(frozen=True)
class SkellamDpEvent(dp_accounting.DpEvent):
    """One round of Skellam noise of total ``variance`` mu (of at least the surviving shares) on an
    integer query of the given sensitivities."""

    l2_sensitivity: float
    l1_sensitivity: float
    variance: float


def tau(local_std: float, clients: int) -> float:
    """Kairouz, Liu and Steinke's inflation of a sum of ``clients`` discrete Gaussians."""
    k = np.arange(1, max(clients, 1), dtype=np.float64)
    return float(10.0 * np.sum(np.exp(-2.0 * math.pi**2 * local_std**2 * k / (k + 1))))


def ddg_rdp(event: DistributedDiscreteGaussianDpEvent, orders) -> np.ndarray:
    """The event's RDP at each order (module docstring)."""
    orders = np.asarray(orders, np.float64)
    scale = math.sqrt(event.clients) * event.local_std
    l2, l1 = event.l2_sensitivity / scale, event.l1_sensitivity / scale
    t, d = tau(event.local_std, event.tau_clients), event.dim
    return np.minimum.reduce(
        [
            orders / 2 * l2**2 + t * d,
            orders / 2 * (l2**2 + 2 * l1 * t + t**2 * d),
            orders / 2 * (l2 + math.sqrt(d) * t) ** 2,
        ]
    )


def skellam_rdp(event: SkellamDpEvent, orders) -> np.ndarray:
    """The event's RDP at each order (module docstring)."""
    a = np.asarray(orders, np.float64)
    l2, l1, mu = event.l2_sensitivity, event.l1_sensitivity, event.variance
    return a * l2**2 / (2 * mu) + np.minimum(
        ((2 * a - 1) * l2**2 + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu)
    )


def poisson_subsampled(rdp, q: float, orders) -> np.ndarray:
    """Zhu and Wang's bound on the RDP of ``rdp`` (a function of an array of orders)
    Poisson-subsampled at rate q, at each order (module docstring)."""
    orders = np.asarray(orders, np.float64)
    plain = rdp(orders)
    integer = (orders >= 2) & (orders == np.floor(orders))
    if q >= 1 or not integer.any():
        return plain
    top = int(orders[integer].max())
    ell = np.arange(2, top + 1, dtype=np.float64)
    eps = rdp(ell)  # eps(l) for l = 2, 3, ..., the largest integer order
    out = plain.copy()
    for i in np.flatnonzero(integer):
        a = int(orders[i])
        l = ell[1 : a - 1]  # 3..a
        log_comb = special.gammaln(a + 1) - special.gammaln(l + 1) - special.gammaln(a - l + 1)
        terms = np.concatenate(
            [
                [0.0, eps[0]],
                (l - 1) * eps[1 : a - 1] + log_comb + (a - l) * np.log1p(-q) + l * np.log(q),
            ]
        )
        weights = np.concatenate(
            [
                [
                    (1 - q) ** (a - 1) * (a * q - q + 1),
                    special.comb(a, 2) * q**2 * (1 - q) ** (a - 2),
                ],
                np.full(len(l), 3.0),
            ]
        )
        out[i] = min(plain[i], float(special.logsumexp(terms, b=weights)) / (a - 1))
    return out


def _doubled_ddg(event):
    return attr.evolve(
        event, l2_sensitivity=2 * event.l2_sensitivity, l1_sensitivity=2 * event.l1_sensitivity
    )


def _doubled_skellam(event):
    return attr.evolve(
        event, l2_sensitivity=2 * event.l2_sensitivity, l1_sensitivity=2 * event.l1_sensitivity
    )


register_event(
    DistributedDiscreteGaussianDpEvent,
    rdp=ddg_rdp,
    poisson_rdp=lambda e, q, orders: poisson_subsampled(lambda o: ddg_rdp(e, o), q, orders),
    double_sensitivity=_doubled_ddg,
)
register_event(
    SkellamDpEvent,
    rdp=skellam_rdp,
    poisson_rdp=lambda e, q, orders: poisson_subsampled(lambda o: skellam_rdp(e, o), q, orders),
    double_sensitivity=_doubled_skellam,
)
