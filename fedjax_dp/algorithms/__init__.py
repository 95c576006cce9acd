"""Federated algorithms; each is ``init(params) -> ServerState`` and ``round(state, cohort, key)``."""
