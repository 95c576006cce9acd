"""Correlated-noise DP-FL: matrix-factorization noise strategies (jax_privacy's, and
binary-tree aggregation), the client participation they are calibrated for, and the noise plan a run
follows."""
