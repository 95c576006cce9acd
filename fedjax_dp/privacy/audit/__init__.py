"""Checking a mechanism against its claim: canary audits that bound epsilon from below (``canary``)
and the check that each release adds the noise it declares and holds its bound
(``release_check``)."""
