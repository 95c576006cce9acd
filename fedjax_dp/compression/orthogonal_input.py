"""A measurement operator applied after an orthogonal map Q of its input: Phi Q (``refresh``'s
permutation Pi, ``signs``' +-1 diagonal D). Q Q^T = I, so (Phi Q)(Phi Q)^T = Phi Phi^T and ||Phi
Q||_2 = ||Phi||_2: the Gram solve and the Lipschitz constant are Phi's, and the min-norm
reconstruction stays an orthogonal projection."""

from __future__ import annotations

import abc

import jax


class OrthogonalInput(abc.ABC):
    """Subclasses hold ``operator`` and define ``forward(x) = Q x`` and ``backward(v) = Q^T v``;
    this gives them the interface of ``operators`` (measure, adjoint, gram_solve, shape,
    lipschitz)."""

    operator: object

    @abc.abstractmethod
    def forward(self, x: jax.Array) -> jax.Array:
        """Q x."""

    @abc.abstractmethod
    def backward(self, v: jax.Array) -> jax.Array:
        """Q^T v."""

    @property
    def shape(self) -> tuple[int, int]:
        return self.operator.shape

    @property
    def lipschitz(self):
        return self.operator.lipschitz

    def measure(self, x: jax.Array) -> jax.Array:
        return self.operator.measure(self.forward(x))

    def adjoint(self, y: jax.Array) -> jax.Array:
        return self.backward(self.operator.adjoint(y))

    def gram_solve(self, y: jax.Array, **options) -> jax.Array:
        return self.operator.gram_solve(y, **options)
