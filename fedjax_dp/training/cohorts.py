"""Which clients take part in a round and how their data is packed for the cohort engine."""

from __future__ import annotations

import math

import numpy as np

from fedjax_dp.data.augmentation import augment_batches
from fedjax_dp.data.normalization import standardized_black
from fedjax_dp.data.packing import (num_steps, pack_cohort, pack_poisson_cohort, pack_sampled_cohort,
                                    pack_uga_cohort)
from fedjax_dp.privacy.client_sampling import client_sampler


def expected_cohort(cfg, num_clients: int) -> float:
    return client_sampler(cfg.sampling, num_clients).expected_cohort()


def sample_cohort(cfg, num_clients: int, generator: np.random.Generator, eligible=None) -> np.ndarray:
    """The round's client ids, drawn by the same sampler whose ``round_event`` the accountant composes."""
    return client_sampler(cfg.sampling, num_clients).sample(generator, eligible)


def poisson_slots(rate: float, num_clients: int, drawn: int) -> int:
    """Fixed cohort capacity for Poisson rounds: mean + 4 sd, rounded up to a multiple of 8."""
    base = rate * num_clients + 4 * math.sqrt(num_clients * rate * (1 - rate))
    return max(8, 8 * math.ceil(max(base, drawn) / 8))


def cohort_slots(cfg, num_clients: int, drawn: int) -> int | None:
    if cfg.sampling.method == "poisson":
        return poisson_slots(cfg.sampling.rate, num_clients, drawn)
    return None


def make_packer(cfg, dataset, requirements):
    """``pack(ids, rng, slots) -> cohort`` with step counts fixed for the whole run (one compiled
    program); with ``requirements.evaluation_pass`` cohorts also carry each client's whole data. With
    ``data.augment='crop_flip'`` every drawn training image is cropped and flipped (``data.augmentation``)."""
    pack = _packer(cfg, dataset, requirements)
    if cfg.data.get("augment", "none") == "none":
        return pack
    fill = standardized_black(cfg.data.source) if cfg.data.get("normalize", "none") == "channel" else 0.0

    def pack_augmented(ids, rng, slots):
        cohort = pack(ids, rng, slots)
        cohort["batches"]["x"] = augment_batches(cohort["batches"]["x"], rng, fill)
        return cohort

    return pack_augmented


def _packer(cfg, dataset, requirements):
    largest, batch, epochs = int(dataset.train_sizes().max()), cfg.client.batch_size, cfg.client.epochs
    indices = lambda ids: [dataset.client_train[i] for i in ids]  # noqa: E731
    if requirements.sampled_steps:
        drawn = batch * requirements.batches_per_step
        small = np.flatnonzero(dataset.train_sizes() < drawn)
        if len(small):
            raise ValueError(f"client.batch_size={batch}: each local step draws {drawn} examples without replacement "
                             f"({requirements.batches_per_step} batches of B), more than the training data of "
                             f"{len(small)} clients (e.g. client {int(small[0])} holds {int(dataset.train_sizes()[small[0]])})")
        if requirements.poisson_batch_cap:
            return lambda ids, rng, slots: pack_poisson_cohort(dataset.x, dataset.y, indices(ids), drawn,
                                                               requirements.sampled_steps,
                                                               requirements.poisson_batch_cap, rng, slots)
        return lambda ids, rng, slots: pack_sampled_cohort(dataset.x, dataset.y, indices(ids), drawn,
                                                           requirements.sampled_steps, rng, slots)
    if not requirements.evaluation_pass:
        max_steps = num_steps(largest, batch, epochs)
        return lambda ids, rng, slots: pack_cohort(dataset.x, dataset.y, indices(ids), batch, epochs, rng,
                                                   max_steps, slots)
    eval_batch = requirements.evaluation_batch_size or batch
    max_steps, max_eval = max(1, num_steps(largest, batch, epochs - 1)), num_steps(largest, eval_batch, 1)
    return lambda ids, rng, slots: pack_uga_cohort(dataset.x, dataset.y, indices(ids), batch, epochs, rng,
                                                   max_steps, slots, eval_batch, max_eval)
