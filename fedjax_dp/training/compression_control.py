"""Per-round compression in the training loop: Alg. 2's dynamic layer-wise rates (seed 004) or fixed
rates, and the algorithm instance compiled for each distinct rate vector.

Rates set the measurement counts, i.e. array shapes, so each distinct rate vector is its own compiled
program; Alg. 2 rounds rates to one decimal, so only a handful ever occur and they are cached. The
reference for Alg. 2 is the initial weights in round 1, else the last applied aggregate
w_t - w_{t-1} (with the default server SGD at rate 1 this is the reconstructed mean update).
"""

from __future__ import annotations

import jax

from fedjax_dp.compression.pytree import LayerwiseCompressor
from fedjax_dp.compression.rates import dynamic_rates, fixed_rates


class CompressionControl:
    def __init__(self, cfg, build):
        """``cfg``: the ``compression`` config section; ``build(compressor)``: the algorithm using it."""
        self.cfg, self.build, self._cache = cfg, build, {}
        self.rates = None

    def rates_for(self, reference):
        c = self.cfg
        if c.rates == "dynamic":
            return dynamic_rates(reference, c.r_min, c.r_max)
        return fixed_rates(reference, float(c.rates))

    def algorithm_for(self, reference):
        """The algorithm whose compressor uses the rates computed from ``reference``."""
        self.rates = self.rates_for(reference)
        key = tuple(jax.tree_util.tree_leaves(self.rates))
        if key not in self._cache:
            compressor = LayerwiseCompressor(reference, self.rates, self.cfg.kind, self.cfg.seed, self.cfg.method)
            self._cache[key] = self.build(compressor)
        return self._cache[key]
