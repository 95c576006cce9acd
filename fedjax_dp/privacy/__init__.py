"""Privacy transforms (clipping, Gaussian noise) and accounting."""
