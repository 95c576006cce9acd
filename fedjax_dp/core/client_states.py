"""Per-client state kept between rounds (SCAFFOLD's control variates c_i, Karimireddy et al. 2020).

A simulation samples a few clients a round out of a population that may be thousands strong, so the
store is sparse and on the host: a client that never took part holds the template (its initial
state) and costs nothing; one that did holds its own copy. ``gather`` stacks the states of a cohort
(padding slots get the template) for the vmapped clients; ``scatter`` writes back the states of the
clients whose update was kept. ``export``/``load`` give the arrays a checkpoint saves
(``training.loop``).
"""

from __future__ import annotations

import chex
import jax
import numpy as np


class ClientStateStore:
    def __init__(self, template):
        self._template = jax.tree_util.tree_map(np.asarray, template)
        self._states: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self._states)

    def get(self, client_id: int):
        return self._states.get(int(client_id), self._template)

    def gather(self, ids, slots: int | None = None):
        """Stacked states of ``ids`` (leading axis ``slots`` or ``len(ids)``; extra slots:
        template)."""
        ids = [int(i) for i in ids]
        slots = len(ids) if slots is None else slots
        if slots < len(ids):
            raise ValueError(f"{len(ids)} clients do not fit in {slots} slots")
        rows = [self.get(i) for i in ids] + [self._template] * (slots - len(ids))
        return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *rows)

    def scatter(self, ids, stacked, keep) -> None:
        """Stores row k of ``stacked`` as the state of ``ids[k]`` where ``keep[k]`` (a dropped
        client keeps its old state). A row whose structure, shapes or dtypes differ from the
        template's (a restored checkpoint of another model, a buggy algorithm) is refused, never
        stored."""
        stacked = jax.tree_util.tree_map(np.asarray, stacked)
        for k, client_id in enumerate(ids):
            if keep[k]:
                row = jax.tree_util.tree_map(lambda x: x[k].copy(), stacked)
                chex.assert_trees_all_equal_shapes_and_dtypes(row, self._template)
                self._states[int(client_id)] = row

    def export(self) -> tuple[list[int], object]:
        """``(ids, stacked states)`` of every client that holds its own state (sorted ids)."""
        ids = sorted(self._states)
        return ids, (self.gather(ids) if ids else None)

    def load(self, ids, stacked) -> None:
        """Replaces the contents with ``export``'s output."""
        self._states = {}
        if ids:
            self.scatter(ids, stacked, [True] * len(ids))

    def template_stack(self, count: int):
        """A stacked pytree of ``count`` templates: the restore target of ``count`` stored
        states."""
        return self.gather([], count)
