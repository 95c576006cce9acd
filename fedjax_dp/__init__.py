"""fedjax_dp: simulation of differentially-private federated learning in JAX.

Layout (dependencies point down): ``core`` (pytrees, RNG, local training, cohort engine) <-
``privacy``, ``compression`` <- ``algorithms``; ``models``; ``data`` <- ``training`` <- experiments.
"""

__version__ = "0.1.0"
