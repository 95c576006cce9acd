"""Which loops a traced program still runs once local training is unrolled: how the engine learns
that a client program is loop-free, instead of trusting a declaration.

On a CPU, XLA runs a convolution's gradient 10-60x slower inside a loop than in straight-line code
(``core.strategy``), so ``auto`` unrolls a conv model's local steps, but only where nothing else in
the client's program loops over the model (UGA's evaluation pass over its batches, say): there
unrolling the steps would leave the slow loop and only add compile time. A ``lax.scan`` whose
``unroll`` covers its whole length lowers to straight-line code; every other ``scan`` (``lax.map``,
a ``fori_loop`` over static bounds) and every ``while`` (a ``while_loop``, a ``fori_loop`` over
bounds known only at run time) is a loop.
"""

from __future__ import annotations

from collections.abc import Iterator

from jax.extend import core as jax_core


def _subjaxprs(params: dict) -> Iterator:
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jax_core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax_core.Jaxpr):
                yield item


def loops_left(jaxpr) -> list[str]:
    """The loops of a (closed) jaxpr and of every jaxpr nested in it (jit, cond branches, custom
    derivatives, scan bodies), in words: each ``while`` and each ``scan`` not unrolled over its
    whole length."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    found = []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "while":
            found.append("while")
        elif name == "scan" and int(eqn.params["unroll"]) < int(eqn.params["length"]):
            found.append(f"scan of length {eqn.params['length']} (unroll {eqn.params['unroll']})")
        for sub in _subjaxprs(eqn.params):
            found.extend(loops_left(sub))
    return found
