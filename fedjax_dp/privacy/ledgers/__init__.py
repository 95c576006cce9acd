"""The ledgers behind the one privacy tracker: the protocol and the client-level central and local
ledgers (``client_level``), budget rules and per-client GDP ledgers (``budget``), and example-level
ledgers with thresholds for local DP-SGD (``example_book``, ``example_ledger``). One module
each; import what you use from it."""
