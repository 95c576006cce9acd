"""Core building blocks: pytree helpers, RNG discipline, local training and the cohort engine."""
