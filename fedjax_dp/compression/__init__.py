"""Compressed-sensing update compression (seed 004, CUAG-PFL Alg. 2-3, Eqs. 13-14; ALGORITHMS.md §4):
layer-wise rates, measurement operators, server reconstruction, coherence, traffic accounting."""
