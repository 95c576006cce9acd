"""One round of workload W (``workload_w_data``) on fedjax_dp's cohort engine, any formulation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp.core import hosts
from fedjax_dp.core.cohort import CohortEngine
from fedjax_dp.core.strategy import StrategyChoice
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.core.deferred_dense import on_by_default
from fedjax_dp.models import get_model
from fedjax_dp.privacy.mechanisms.clipping import clip_by_global_norm
from fedjax_dp.training.build import spread
from fedjax_dp.core.host_devices import use_a_device_per_core

use_a_device_per_core()  # what a run gets: one CPU device per core, asked for before JAX starts

from workload_w_data import (
    BATCH,
    CLIP,
    LR,
    MODELS,
    POPULATION,
    SIGMA,
    STEPS,
    cohort_ids,
    make_population,
)


def memory_bytes(compiled) -> dict:
    """XLA's memory analysis of a compiled program: argument / output / temp / alias bytes."""
    memory = compiled.memory_analysis()
    return {
        name: int(getattr(memory, f"{name}_size_in_bytes"))
        for name in ("argument", "output", "temp", "alias")
    }


class WorkloadW:
    """One DP-FedAvg round of workload W with a chosen engine formulation."""

    def __init__(
        self,
        model: str,
        strategy: str,
        chunk_size,
        unroll,
        conv_impl: str,
        compute_dtype=None,
        population: int = POPULATION,
        stream_size: int | None = None,
        devices: int = 1,
        deferred_dense: bool | None = None,
    ):
        self.model = get_model(MODELS[model], conv_impl=conv_impl, compute_dtype=compute_dtype)
        self.population = max(population, POPULATION)
        if deferred_dense is None:  # engine.deferred_dense='auto'
            deferred_dense = on_by_default()
        fedavg = FedAvg(
            self.model.per_example_loss,
            optax.sgd(LR),
            unroll=unroll,
            deferred_dense_rate=LR if deferred_dense else None,
        )

        def client_fn(params, client):
            # FedAvg's ClientUpdate (deferred dense kernels or not)
            train = fedavg.local_trainer(params, client)
            trained, _ = train(params, client["batches"], client["mask"], client["key"])
            delta = jax.tree_util.tree_map(jnp.subtract, trained, params)
            result = clip_by_global_norm(delta, CLIP)
            return result.clipped, result.norm

        # loop: round-robin; else a mesh
        over = spread(StrategyChoice(strategy, chunk_size, unroll, conv_impl, devices))
        self.engine = CohortEngine(client_fn, strategy, chunk_size, stream_size=stream_size, **over)
        self.params = self.model.init(jax.random.key(0))
        self.x, self.y = make_population(population=self.population)

        @jax.jit
        def server(params, clipped_sum, key, cohort):
            leaves, treedef = jax.tree_util.tree_flatten(clipped_sum)
            keys = jax.random.split(key, len(leaves))
            noisy = [
                s + SIGMA * CLIP * jax.random.normal(k, s.shape, s.dtype)
                for s, k in zip(leaves, keys)
            ]
            mean = jax.tree_util.tree_unflatten(treedef, noisy)
            return jax.tree_util.tree_map(lambda p, m: p + m / cohort, params, mean)

        self.server = server

    def _cohort(self, round_index: int, cohort: int) -> dict:
        """The cohort's clients, or under several processes this host's rows of them
        (``hosts.host_rows``)."""
        rows = hosts.host_rows(cohort)
        ids = cohort_ids(round_index, cohort, self.population)[rows]
        n = len(ids)
        return {
            "batches": {
                "x": self.x[ids].reshape(n, STEPS, BATCH, 28, 28, 1),
                "y": self.y[ids].reshape(n, STEPS, BATCH),
            },
            "mask": np.ones((n, STEPS, BATCH), bool),
            "key": jax.random.split(jax.random.key(round_index), cohort)[rows],
        }

    def program_memory(self, cohort: int) -> dict:
        """XLA's memory analysis (bytes) of ``compiled_program``. A device peak above argument +
        output + temp is memory held outside the program (issue 20: the GPU's peak grew by ~2x the
        cohort's input bytes while this CPU's temp did not)."""
        return memory_bytes(self.compiled_program(cohort))

    def compiled_program(self, cohort: int):
        """The engine's program for one call, compiled: the whole cohort, or one slice when
        streamed; for ``loop``, the one-client program it calls once per client."""
        # one client's data gives the shapes: no cohort-sized gather
        one_client = self._cohort(0, 1)
        # no cohort program: the per-client program it calls C times
        if self.engine.strategy == "loop":
            client = jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), one_client
            )
            program = jax.jit(self.engine.client_fn).lower(self.params, client)
        else:
            n = cohort if self.engine.stream_size is None else min(cohort, self.engine.stream_size)
            shapes = jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct((n,) + x.shape[1:], x.dtype), one_client
            )
            # any device
            params = jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self.params
            )
            program = jax.jit(self.engine.trace).lower(params, shapes)
        return program.compile()

    def round(self, round_index: int, cohort: int):
        clients = self._cohort(round_index, cohort)
        clipped_sum, norms = self.engine(self.params, clients)
        self.params = self.server(
            self.params, clipped_sum, jax.random.key(10**6 + round_index), float(cohort)
        )
        jax.block_until_ready(self.params)
        return norms
