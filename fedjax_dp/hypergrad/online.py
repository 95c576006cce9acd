"""Online adaptation of the round's settings: after each round, one hyper-gradient step.

Baydin et al. 2018 ("Online learning rate adaptation with hypergradient descent", ICLR, Eq. 2)
adapt a learning rate alpha_t = alpha_{t-1} - beta dL/dalpha with the derivative of the loss after
the step just taken. Here the step is a federated round (Rush, Charles and Garrett, "Federated
automatic differentiation", TMLR 2024): with theta the log-multipliers of the settings
(``differentiable``),

    theta_{t+1} = theta_t - beta dL_held-out(w_{t+1}(theta)) / dtheta,

only the adapted settings' entries moving (``hypergrad.adapt``), beta = ``hypergrad.hyper_lr``. A
hyper-gradient that is not finite is not applied. ``hypergrad.step_rule="normalized"`` steps by
beta g / ||g|| instead (the norm over the adapted entries): the plain step scales with the loss and
its curvature, so a beta that recovers a rate 10x too small in a few rounds overshoots elsewhere;
the normalised one moves the log-multipliers by exactly beta a round (a factor e^beta).

Source ``clients``: the sampled clients' own held-out losses, their derivatives clipped and noised
(``client_source``). Source ``server``: L is the loss on a batch of the server-held set. Where only
the server learning rate adapts with a lookahead of one round, the hyper-gradient is computed from
the released mean alone (``server_step_hypergradient``): post-processing of the release, no privacy
cost. Otherwise it is computed through the clients' local training (``hypergradient``), which reads
their data: a simulation of federated automatic differentiation that only a run without a privacy
guarantee may use (``config`` refuses it with DP). A lookahead of r rounds replays the last r
rounds' cohorts, keys and noise from the state r rounds back, with the current settings (truncated
back-propagation through the rounds); its history is not checkpointed, so after a resume it refills
over r rounds.

Backtracking (``hypergrad.backtrack`` = r > 0, source ``server``): a round whose held-out loss on
the step's batch rises by more than r relative to the loss before it, or is not finite, is undone
(the model and the server optimizer stay, the adapted learning rates halve): a hyper-gradient step
cannot undo a round that already wrecked the model (a start 10x too large), backtracking can (the
step-size halving of a line search, Nocedal and Wright, "Numerical Optimization", Alg. 3.1).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.core import rng
from fedjax_dp.hypergrad.differentiable import (
    Hypertuned,
    held_out_loss,
    hypergradient,
    server_step_hypergradient,
)

HALVED = ("client_lr", "server_lr")
"""The rates an undone round halves (``HyperOptions.backtrack``)."""


@dataclasses.dataclass(frozen=True)
class HyperOptions:
    """The ``hypergrad`` section's choices (``config``)."""

    adapt: tuple[str, ...]
    hyper_lr: float
    lookahead: int = 1
    remat: bool = False
    batch_size: int = 256
    step_rule: str = "sgd"  # or "normalized": theta -= beta g / ||g||
    backtrack: float = 0.0  # > 0: undo a round whose held-out loss rises by more than this

    @property
    def server_only(self) -> bool:
        """Whether the hyper-gradient is post-processing of the released mean alone."""
        return self.adapt == ("server_lr",) and self.lookahead == 1


@dataclasses.dataclass(frozen=True)
class OnlineHypertuned(Hypertuned):
    """``Hypertuned`` whose settings take one hyper-gradient step after each round (``adapt``), on
    a batch of the server-held set (``held_x``, ``held_y``). ``client_lr`` and ``server_lr``: the
    configured rates, for the logged values."""

    options: HyperOptions = None
    held_x: Any = None
    held_y: Any = None
    client_lr: float = 1.0
    server_lr: float = 1.0
    # ``source=clients``: the clients' clipped, noised hyper-gradient (``client_source``)
    client_source: Any = None
    _history: collections.deque = dataclasses.field(
        default_factory=collections.deque, compare=False, repr=False
    )
    # the jitted server-side program, built once per instance (a module-level cache keyed by
    # the instance would keep every run's held-out set alive)
    _programs: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def held_out_batch(self, key: jax.Array) -> tuple[dict, np.ndarray]:
        """A batch of ``options.batch_size`` server-held examples drawn without replacement (all of
        them when there are fewer)."""
        n = len(self.held_y)
        size = min(self.options.batch_size, n)
        index = np.asarray(jax.random.choice(key, n, (size,), replace=False))
        batch = {"x": self.held_x[index], "y": np.asarray(self.held_y)[index].astype(np.int32)}
        return batch, np.ones(size, bool)

    def adapt_settings(self, runner, previous, result, cohort, key: jax.Array, inputs: dict):
        """``(state, row)``: ``result.state`` with the settings after one hyper-gradient step, and
        the row entries ``hypergrad_*`` (the held-out loss before the step and the settings the
        next round uses). ``previous``: the state the round started from; ``cohort``, ``key`` and
        ``inputs``: the round's arguments (``FederatedRound.__call__``'s)."""
        if self.client_source is not None:  # the held-out loss is not released: not logged
            grads = self.client_source(runner, previous, result, cohort, key, inputs)
            settings = step(previous.extra, grads, self.options)
            return result.state.replace(extra=settings), self.logged(settings)
        keys = jax.random.split(rng.purpose_key(key, rng.Purpose.HYPERGRAD))
        batch, mask = self.held_out_batch(keys[0])
        if self.options.backtrack > 0:
            undone = self._backtracked(previous, result, batch, mask, keys[1])
            if undone is not None:
                return undone
        if self.options.server_only:
            if "server" not in self._programs:
                self._programs["server"] = jax.jit(
                    lambda state, mean, batch, mask, k: server_step_hypergradient(
                        self, self.per_example_loss, state, mean, batch, mask, k
                    )
                )
            program = self._programs["server"]
            loss, grads = program(previous, result.released, batch, mask, keys[1])
        else:
            f, args = runner.function(previous, cohort, key, **inputs)
            self._history.append((previous, args))
            while len(self._history) > self.options.lookahead:
                self._history.popleft()
            start = self._history[0][0].replace(extra=previous.extra)
            rounds = [a for _, a in self._history]
            program = _round_program(f, self.per_example_loss, self.options.remat)
            loss, grads = program(start, rounds, batch, mask, keys[1])
        settings = step(previous.extra, grads, self.options)
        state = result.state.replace(extra=settings)
        return state, {"hypergrad_loss": float(loss), **self.logged(settings)}

    def _backtracked(self, previous, result, batch, mask, key):
        """``(state, row)`` undoing the round where its held-out loss L(w_{t+1}) is not finite or
        exceeds (1 + ``backtrack``) L(w_t) on the same batch: the model and the server optimizer
        stay where the round started, the adapted client and server rates halve, and no
        hyper-gradient step is taken (its derivative is of the undone point); else None. The
        round's release still happened and is accounted; undoing it is post-processing."""
        if "loss" not in self._programs:
            loss = functools.partial(held_out_loss, self.per_example_loss)
            self._programs["loss"] = jax.jit(loss)
        before = float(self._programs["loss"](previous.params, batch, mask, key))
        after = float(self._programs["loss"](result.state.params, batch, mask, key))
        if np.isfinite(after) and after <= (1 + self.options.backtrack) * before:
            return None
        settings = {
            name: value - np.log(2.0) if name in self.options.adapt and name in HALVED else value
            for name, value in previous.extra.items()
        }
        state = result.state.replace(
            params=previous.params, opt_state=previous.opt_state, extra=settings
        )
        row = {"hypergrad_loss": after, "hypergrad_undone": True, **self.logged(settings)}
        return state, row

    def logged(self, settings) -> dict:
        """The adapted settings as a row's values: the learning rates themselves, the step
        weights as a list."""
        row = {}
        if "client_lr" in self.options.adapt:
            row["hypergrad_client_lr"] = self.client_lr * float(jnp.exp(settings["client_lr"]))
        if "server_lr" in self.options.adapt:
            row["hypergrad_server_lr"] = self.server_lr * float(jnp.exp(settings["server_lr"]))
        if "step_weights" in self.options.adapt:
            row["hypergrad_step_weights"] = [
                float(w) for w in np.exp(np.asarray(settings["step_weights"]))
            ]
        return row


def step(settings: dict, grads: dict, options: HyperOptions) -> dict:
    """theta - beta g (or beta g / ||g||, ``options.step_rule="normalized"``) on the adapted
    settings (module docstring); unchanged where g is not finite or, normalised, zero."""
    finite = all(bool(jnp.all(jnp.isfinite(grads[name]))) for name in options.adapt)
    if not finite:
        return settings
    scale = options.hyper_lr
    if options.step_rule == "normalized":
        norm = float(jnp.sqrt(sum(jnp.sum(jnp.square(grads[name])) for name in options.adapt)))
        if norm == 0.0:
            return settings
        scale = options.hyper_lr / norm
    return {
        name: value - scale * grads[name] if name in options.adapt else value
        for name, value in settings.items()
    }


@functools.cache
def _round_program(function, per_example_loss, remat: bool):
    return jax.jit(
        lambda state, rounds, batch, mask, key: hypergradient(
            function, per_example_loss, state, rounds, batch, mask, key, remat
        )
    )
