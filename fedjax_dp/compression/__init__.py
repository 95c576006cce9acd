"""Compressed-sensing update compression (CUAG-PFL Alg. 2-3, Eqs. 13-14; ALGORITHMS.md §4):
layer-wise rates, measurement operators, server reconstruction, coherence, traffic accounting."""

from fedjax_dp.compression import config  # noqa: F401  (registers the compression section)
from fedjax_dp.compression.coherence import coherence
from fedjax_dp.compression.operators import BlockSum, RandomMatrix, make_operator
from fedjax_dp.compression.rates import dynamic_rates, fixed_rates
from fedjax_dp.compression.reconstruction import reconstruct
from fedjax_dp.compression.traffic import TrafficMeter, dense_upload_bytes
from fedjax_dp.compression.upload_transform import CompressedSensing

__all__ = [
    "coherence",
    "BlockSum",
    "RandomMatrix",
    "make_operator",
    "dynamic_rates",
    "fixed_rates",
    "reconstruct",
    "TrafficMeter",
    "dense_upload_bytes",
    "CompressedSensing",
]
