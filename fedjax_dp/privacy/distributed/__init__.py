"""Distributed DP under a simulated secure aggregation: rotation, quantisation, discrete noise
shares, modular sums, dropouts (``transform``), the round's parameters (``plan``) and its accounting
events (``events``, registered with the accountants on import)."""

from fedjax_dp.privacy.distributed import events  # noqa: F401  (registers the events)
