"""Checking a mechanism against its claim: canary audits that bound epsilon from below (``canary``),
the check that each release adds the noise it declares and holds its bound (``release_check``), and
canary clients inside a real run with the empirical epsilon they give (``in_run``, ``estimates``;
the ``audit`` config section, ``config``)."""

from fedjax_dp.privacy.audit import config  # noqa: F401  (registers the audit section)
