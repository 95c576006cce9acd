"""Federated data: the in-memory dataset, partitioners, client sampling and cohort packing."""
