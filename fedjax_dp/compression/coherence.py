"""Mutual coherence of a measurement matrix and a sparsity basis (seed 004, Eq. 14):

    v(Phi, Psi) = sqrt(a) max_{i,j} |<phi_i, psi_j>| / (||phi_i||_2 ||psi_j||_2)

phi_i: the rows of Phi (b x a); psi_j: the columns of the basis Psi (a x a). It lies in [1,
sqrt(a)]; smaller means the measurements spread a sparse signal's energy better (Candes and Wakin
2008).
"""

from __future__ import annotations

import numpy as np
from scipy.fft import dct

BASES = ("dct", "dft")


def basis(name: str, size: int) -> np.ndarray:
    """Columns are the orthonormal DCT-II or DFT basis vectors of length ``size``."""
    if name == "dct":
        return dct(np.eye(size), norm="ortho", axis=0).T
    if name == "dft":
        return np.fft.ifft(np.eye(size), norm="ortho", axis=0)
    raise ValueError(f"unknown basis {name!r}; choose one of {BASES}")


def coherence(phi: np.ndarray, psi: np.ndarray) -> float:
    """Eq. 14 for a dense ``phi`` (b x a) and basis ``psi`` (a x a, columns)."""
    phi = np.asarray(phi, np.float64)
    if phi.ndim != 2 or psi.shape != (phi.shape[1], phi.shape[1]):
        raise ValueError(f"phi must be b x a and psi a x a; got {phi.shape} and {psi.shape}")
    rows = np.linalg.norm(phi, axis=1, keepdims=True)
    cols = np.linalg.norm(psi, axis=0, keepdims=True)
    if np.any(rows == 0):
        raise ValueError("phi has an all-zero row: its coherence is undefined")
    inner = np.abs(phi @ np.conj(psi)) / (rows * cols)
    return float(np.sqrt(phi.shape[1]) * inner.max())
