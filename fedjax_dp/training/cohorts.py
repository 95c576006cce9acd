"""Which clients take part in a round and how their data is packed for the cohort engine."""

from __future__ import annotations

import os

import numpy as np

from fedjax_dp.data.augmentation import augment_batches
from fedjax_dp.data.normalization import standardized_black
from fedjax_dp.data.packing import (
    num_steps,
    pack_cohort,
    pack_poisson_cohort,
    pack_sampled_cohort,
    pack_uga_cohort,
)
from fedjax_dp.privacy.sampling import build as client_sampler


def expected_cohort(cfg, num_clients: int) -> float:
    return client_sampler(cfg.sampling, num_clients).expected_cohort()


def sample_cohort(
    cfg, num_clients: int, generator: np.random.Generator, eligible=None, t: int = 1
) -> np.ndarray:
    """Round t's client ids, drawn by the same sampler whose event (or participation scheme) the
    ledger accounts."""
    return client_sampler(cfg.sampling, num_clients).sample(generator, eligible, t)


def cohort_slots(cfg, num_clients: int, drawn: int) -> int | None:
    """The capacity a round's cohort is packed into, where cohorts vary in size (None: exactly the
    cohort): the sampler's."""
    return client_sampler(cfg.sampling, num_clients).slots(drawn)


def make_packer(cfg, dataset, requirements):
    """``pack(ids, rng, slots, rows=None) -> cohort`` with step counts fixed for the whole run (one
    compiled program; ``rows``: gather only those slots' examples, ``data.packing``); with
    ``requirements.evaluation_pass`` cohorts also carry each client's whole data. With
    ``data.augment='crop_flip'`` every drawn training image is cropped and flipped
    (``data.augmentation``)."""
    pack = _packer(cfg, dataset, requirements)
    if cfg.data.get("augment", "none") == "none":
        return pack
    fill = (
        standardized_black(cfg.data.source)
        if cfg.data.get("normalize", "none") == "channel"
        else 0.0
    )

    def pack_augmented(ids, rng, slots, rows=None):
        cohort = pack(ids, rng, slots, rows)
        cohort["batches"]["x"] = augment_batches(
            cohort["batches"]["x"],
            rng,
            fill,
            None if rows is None else (rows, cohort["mask"].shape[0]),
        )
        return cohort

    return pack_augmented


def _packer(cfg, dataset, requirements):
    """The packing function of ``make_packer``, after checking that one round's cohort fits in
    memory.

    Epoch-based packing (FedAvg's ClientUpdate, UGA) packs batches ``min(B, largest client)`` wide:
    a batch of B >= n_k is the client's whole data (McMahan et al. 2017's B = infinity), the same
    steps and masked means whatever B above that (``client.batch_size=100000`` had packed
    100,000-wide batches and was OOM-killed)."""
    largest, epochs = int(dataset.train_sizes().max()), cfg.client.epochs
    batch = min(cfg.client.batch_size, largest)
    indices = lambda ids: [dataset.client_train[i] for i in ids]  # noqa: E731
    if requirements.sampled_steps:
        drawn = cfg.client.batch_size * requirements.batches_per_step
        small = np.flatnonzero(dataset.train_sizes() < drawn)
        if len(small):
            raise ValueError(
                f"client.batch_size={cfg.client.batch_size}: each local step draws {drawn} examples"
                f" without replacement ({requirements.batches_per_step} batches of B), more than"
                f" the training data of {len(small)} clients (e.g. client {int(small[0])} holds"
                f" {int(dataset.train_sizes()[small[0]])})"
            )
        width = requirements.poisson_batch_cap or drawn
        _check_fits(
            cfg,
            dataset,
            [(requirements.sampled_steps, width)],
            f"the algorithm's {requirements.sampled_steps} local steps and"
            f" client.batch_size={cfg.client.batch_size}",
        )
        if requirements.poisson_batch_cap:
            return lambda ids, rng, slots, rows=None: pack_poisson_cohort(
                dataset.x,
                dataset.y,
                indices(ids),
                drawn,
                requirements.sampled_steps,
                requirements.poisson_batch_cap,
                rng,
                slots,
                rows,
            )
        return lambda ids, rng, slots, rows=None: pack_sampled_cohort(
            dataset.x, dataset.y, indices(ids), drawn, requirements.sampled_steps, rng, slots, rows
        )
    if not requirements.evaluation_pass:
        max_steps = num_steps(largest, batch, epochs)
        _check_fits(cfg, dataset, [(max_steps, batch)], _epoch_keys(cfg))
        return lambda ids, rng, slots, rows=None: pack_cohort(
            dataset.x, dataset.y, indices(ids), batch, epochs, rng, max_steps, slots, rows
        )
    eval_batch = min(requirements.evaluation_batch_size or batch, largest)
    max_steps, max_eval = (
        max(1, num_steps(largest, batch, epochs - 1)),
        num_steps(largest, eval_batch, 1),
    )
    _check_fits(cfg, dataset, [(max_steps, batch), (max_eval, eval_batch)], _epoch_keys(cfg))
    return lambda ids, rng, slots, rows=None: pack_uga_cohort(
        dataset.x,
        dataset.y,
        indices(ids),
        batch,
        epochs,
        rng,
        max_steps,
        slots,
        eval_batch,
        max_eval,
        rows,
    )


def _epoch_keys(cfg) -> str:
    return f"client.epochs={cfg.client.epochs}, client.batch_size={cfg.client.batch_size}"


def _check_fits(cfg, dataset, passes, sized_by: str) -> None:
    """Refuse, naming the keys, a configuration whose packed cohort alone (``passes``: (steps, batch
    width) of each packed pass, for the most clients a round can hold) exceeds this machine's
    physical memory: it could only end in the OOM killer's silent kill, rounds or hours into the
    run."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): nothing to compare with
        return
    # the most a round packs
    sampler = client_sampler(cfg.sampling, dataset.num_clients)
    slots = sampler.capacity()
    # input, label, mask, gather and example index (int64)
    example = dataset.x[:1].nbytes + 4 + 1 + 2 * 8
    needed = slots * example * sum(steps * width for steps, width in passes)
    if needed > memory:
        sampling = sampler.sized_by()
        raise ValueError(
            f"one round's packed cohort needs {needed / 1e9:.1f} GB ({slots} clients x "
            f"{' + '.join(f'{steps} steps x {width}' for steps, width in passes)} examples of "
            f"{example} B), more than this machine's {memory / 1e9:.1f} GB of memory; sized by "
            f"{sized_by} and {sampling}: lower one of them"
        )
