"""Accounting on Google's ``dp_accounting``: round events and accountants (RDP, PLD, calibration:
``accountant``), samplers that carry their own event (``client_sampling``), PLDs built once
(``cached_pld``), Gaussian DP (``gdp``), per-client calibration of local noise
(``local_calibration``) and the delta charge of truncated Poisson batches (``poisson_truncation``).
One module each; import what you use from it."""
