"""Server-side reconstruction ``Rec`` of a layer from its measurements (seed 004 cites a generic CS
recovery; ALGORITHMS.md §4 asks for two):

* ``min_norm``: the minimum-norm least-squares solution x = Phi^T (Phi Phi^T)^{-1} y (for the block
  matrix: each measurement spread evenly over its block, closed form). Linear in y.
* ``ista_dct``: sparse recovery in the orthonormal DCT basis Psi, ISTA (Daubechies et al. 2004) on
  1/2 ||Phi Psi s - y||^2 + lambda ||s||_1 with step 1 / ||Phi||^2; x = Psi s. lambda is
  ``sparsity_weight`` times max |Psi^T Phi^T y| (the smallest lambda giving s = 0), so it scales
  with y.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.fft import dct, idct

METHODS = ("min_norm", "ista_dct")


def min_norm(operator, y: jax.Array) -> jax.Array:
    return operator.adjoint(operator.gram_solve(y))


def _soft_threshold(v, t):
    return jnp.sign(v) * jnp.maximum(jnp.abs(v) - t, 0.0)


def ista_dct(
    operator, y: jax.Array, sparsity_weight: float = 0.01, iterations: int = 100
) -> jax.Array:
    step = 1.0 / operator.lipschitz
    correlation = dct(operator.adjoint(y), norm="ortho")
    lam = sparsity_weight * jnp.max(jnp.abs(correlation))

    def iterate(s, _):
        residual = operator.measure(idct(s, norm="ortho")) - y
        s = _soft_threshold(s - step * dct(operator.adjoint(residual), norm="ortho"), step * lam)
        return s, None

    s, _ = jax.lax.scan(iterate, jnp.zeros(operator.shape[1], y.dtype), None, length=iterations)
    return idct(s, norm="ortho")


def reconstruct(operator, y: jax.Array, method: str = "min_norm", **options) -> jax.Array:
    if method == "min_norm":
        return min_norm(operator, y)
    if method == "ista_dct":
        return ista_dct(operator, y, **options)
    raise ValueError(f"unknown reconstruction {method!r}; choose one of {METHODS}")
