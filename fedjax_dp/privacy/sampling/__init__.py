"""Client samplers, each registered under its ``sampling.method`` name with the keys it reads
(``registry``): fixed-size (``uniform``), Poisson, and the participation schemes of correlated
noise. The sampler that draws a round's cohort states that round's accounting event."""

from fedjax_dp.privacy.sampling import fixed_size, participation, poisson  # noqa: F401
from fedjax_dp.privacy.sampling.fixed_size import FixedSizeSampling
from fedjax_dp.privacy.sampling.participation import ParticipationSampling, participation_of
from fedjax_dp.privacy.sampling.poisson import PoissonSampling
from fedjax_dp.privacy.sampling.registry import (
    build,
    names,
    participation_schemes,
    register_sampler,
    unregister_sampler,
)

__all__ = [
    "FixedSizeSampling",
    "ParticipationSampling",
    "PoissonSampling",
    "build",
    "names",
    "participation_of",
    "participation_schemes",
    "register_sampler",
    "unregister_sampler",
]
