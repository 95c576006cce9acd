"""Accounting on Google's ``dp_accounting``: round events and accountants (RDP, PLD:
``accountant``), the one calibration path (``calibration``), the events the project registers
beyond dp_accounting's (``events``), PLDs built once (``cached_pld``), Gaussian DP (``gdp``) and the
delta charge of truncated Poisson batches (``poisson_truncation``). It imports no mechanism and no
sampler. One module each; import what you use from it."""
