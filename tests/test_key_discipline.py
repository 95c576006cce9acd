"""The package's key rule (``core.rng``): every JAX key has exactly one use: it is folded (with
distinct tags), split (once), or drawn from (once), never two of these. With partitionable threefry
``fold_in(k, d) == split(k, n)[d]`` and a draw's 32-bit words at flat index i are the XOR of the
words of ``split(k, N)[i]``, so a key used two ways gives two releases the same randomness (issue
74, F01: the local adaptive clip's count noise was leaf 4's upload noise).

The test records every ``jax.random`` use made while a whole run executes (model initialisation,
every round's training, upload noise, count noise, server noise, meta step, evaluation), inside jit
and vmap through ``jax.debug.callback``, and checks the rule; a statistical test checks that the
count noise and every leaf's noise of the real round are uncorrelated."""

from __future__ import annotations

import collections
import functools
import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.core import round as round_lib
from fedjax_dp.core.algorithm import ClientOut
from fedjax_dp.core.uploads import chain, fixed_denominator
from fedjax_dp.privacy.mechanisms.upload_layer_quantile_clip import PerLayerQuantileClip
from fedjax_dp.privacy.mechanisms.upload_noise import GaussianNoise
from fedjax_dp.training.default_config import default_config
from fedjax_dp.training.loop import run_experiment

DRAWS = (
    "normal",
    "uniform",
    "bits",
    "bernoulli",
    "randint",
    "permutation",
    "choice",
    "truncated_normal",
    "categorical",
    "gumbel",
    "rademacher",
    "laplace",
    "exponential",
)


def _data(key) -> tuple:
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return data


PUBLIC_SITES = ("operators.py", "materialized.py")
"""Where compressed sensing draws its public measurement matrices (``rng.public_key``): a tile is
regenerated from the same key whenever it is needed, so only there may one line draw one key
again."""


class KeyLog:
    """Every (use, key words, fold tag, call site) the instrumented ``jax.random`` saw, at run
    time."""

    def __init__(self):
        self.uses: list[tuple[str, tuple, int | None, str]] = []

    def record(self, use, site, words, tag=None):
        # one key, or a batch (split of an array)
        words = np.asarray(words).reshape(-1, np.shape(words)[-1])
        for row in words:
            self.uses.append(
                (
                    use,
                    tuple(int(w) for w in row),
                    None if tag is None else int(np.ravel(tag)[0]),
                    site,
                )
            )

    def violations(self) -> list[str]:
        by_key = collections.defaultdict(list)
        for use, words, tag, site in self.uses:
            if site.split(":")[0] in PUBLIC_SITES and (use, tag, site) in by_key[words]:
                continue  # a public matrix regenerated from its key: the same draw again, by design
            by_key[words].append((use, tag, site))
        found = []
        for words, uses in by_key.items():
            kinds = {u for u, _, _ in uses}
            tags = [t for _, t, _ in uses]
            if (
                len(kinds) > 1
                or (kinds != {"fold"} and len(uses) > 1)
                or len(set(tags)) < len(tags)
            ):
                found.append(
                    f"key {words}: " + "; ".join(sorted({f"{u}({t}) at {s}" for u, t, s in uses}))
                )
        return found


def _site() -> str:
    """The first caller outside JAX, ``core/rng.py`` and this file (the package's line that asked
    for the key use)."""
    for frame in inspect.stack()[2:]:
        if "/jax/" not in frame.filename and not frame.filename.endswith(
            ("test_key_discipline.py", "core/rng.py")
        ):
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return "?"


@pytest.fixture
def key_log(monkeypatch):
    """Instruments ``jax.random``'s split, fold_in and draws for the test's duration (jit caches
    cleared before and after, so every program is traced with, and later without, the recording)."""
    log = KeyLog()
    original = {name: getattr(jax.random, name) for name in ("split", "fold_in") + DRAWS}

    def recorded(use, fn, with_tag=False):
        def wrapper(key, *args, **kwargs):
            record = functools.partial(log.record, use, _site())
            if with_tag:
                jax.debug.callback(record, _data(key), jnp.asarray(args[0], jnp.uint32))
            else:
                jax.debug.callback(record, _data(key))
            return fn(key, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(jax.random, "split", recorded("split", original["split"]))
    monkeypatch.setattr(jax.random, "fold_in", recorded("fold", original["fold_in"], with_tag=True))
    for name in DRAWS:
        monkeypatch.setattr(jax.random, name, recorded("draw", original[name]))
    jax.clear_caches()
    yield log
    jax.effects_barrier()
    jax.clear_caches()


def _tiny(c, rounds=2):
    c.rounds, c.eval_every, c.data.num_clients = rounds, rounds, 20
    c.client.update(epochs=1, batch_size=50)
    c.sampling.cohort_size = 5
    c.engine.strategy = "vmap"
    return c


def _dp_fedavg_local_adaptive():
    c = _tiny(default_config())
    c.algorithm = "dp_fedavg"
    c.dp.update(clip="per_layer_adaptive", clip_norm=0.5, noise_multiplier=1.0, noise_mode="local")
    return c


def _dp_fedavg_central_adaptive_fedmeta():
    c = _tiny(default_config())
    c.algorithm = "dp_fedavg"
    c.dp.update(clip="adaptive", clip_norm=0.5, noise_multiplier=1.0, noise_mode="central")
    c.fedmeta.enabled = True
    return c


def _dp_uga():
    c = _tiny(default_config())
    c.algorithm = "dp_uga"
    c.client.epochs = 2
    c.dp.update(clip="fixed", clip_norm=0.5, noise_multiplier=1.0, noise_mode="central")
    return c


def _ldp_minibatch():
    c = _tiny(default_config())
    c.algorithm = "ldp_minibatch"
    c.server_data.overlap = 0.0
    return c


def _cuag_sound_adaptive_clip_gaussian_measurements():
    """F01's measured case, with random measurement matrices seeded like the run (both seeds 0)."""
    c = _tiny(default_config())
    # a dense Gaussian Phi of mlp_2nn's kernel would be 39 GB
    c.algorithm, c.model.name = "cuag_pfl", "logistic"
    c.data.update(num_clients=10, test_fraction=0.25)
    c.client.batch_size = 8
    c.pfldyn.local_steps = 2
    c.compression.update(enabled=True, kind="gaussian", rates="0.4", seed=0)
    c.cuag.update(mode="sound", participations=2, adaptive_clip=True, count_noise_std=30.0)
    return c


@pytest.mark.parametrize(
    "make_config",
    [
        _dp_fedavg_local_adaptive,
        _dp_fedavg_central_adaptive_fedmeta,
        _dp_uga,
        _ldp_minibatch,
        _cuag_sound_adaptive_clip_gaussian_measurements,
    ],
)
def test_every_key_a_run_derives_has_exactly_one_use(key_log, make_config, tmp_path):
    run_experiment(make_config(), str(tmp_path / "run"), progress=False)
    jax.effects_barrier()
    assert len(key_log.uses) > 50  # the recording saw the run
    assert sum(u[0] == "draw" for u in key_log.uses) > 5
    violations = key_log.violations()
    assert not violations, "\n".join(violations[:20])


def test_the_local_count_noise_and_every_leafs_upload_noise_are_uncorrelated():
    """The real round's per-client keys (``core.round.client_inputs``) through the real client side
    (``core.round.send``): zero updates, so each client's upload is pure leaf noise and its counts
    are 1/2 + count noise. Over N clients the sample correlation of two independent normals is about
    N(0, 1/N); the bound 5.5 / sqrt(N) keeps the false-alarm chance over all pairs tested below
    1e-4, and the shared-key defect (correlation 1/4) is 16 standard deviations away."""
    leaves = {f"w{i}": jnp.zeros((3,)) for i in range(8)}  # eight leaves: leaf 4 exists
    clip = PerLayerQuantileClip(
        initial_layer_norms=(1.0,) * 8, count_noise_std=1.0, denominator=10.0, local=True
    )
    uploads = chain(clip, GaussianNoise(((1, 1.0),), local=True), fixed_denominator(10.0))
    states = uploads.init(leaves)
    inputs = uploads.inputs(1)
    n = 4096
    cohort = {
        "batches": np.zeros((n, 1)),
        "mask": np.ones((n, 1), bool),
        "num_examples": np.ones(n, np.int32),
        "client_id": np.arange(n, dtype=np.int32),
    }
    clients = round_lib.client_inputs(cohort, jax.random.key(1), jax.random.key(2))
    out = ClientOut(leaves, jnp.float32(1.0), None, jnp.float32(0.0), jnp.bool_(True))

    def one(client):
        summed, _ = round_lib.send(uploads, states, inputs, client, out, jnp.bool_(True))
        return summed["extras"][0]["layer_counts"], summed["upload"]

    counts, noise = jax.jit(jax.vmap(one))({k: v for k, v in clients.items()})
    counts = np.asarray(counts) - 0.5
    leaf_noise = np.concatenate([np.asarray(noise[f"w{i}"]) for i in range(8)], axis=1)  # (n, 24)
    assert counts.std() == pytest.approx(1.0, rel=0.05)
    both = np.concatenate([counts, leaf_noise], axis=1)
    corr = np.corrcoef(both, rowvar=False)[:8, 8:]
    assert np.abs(corr).max() < 5.5 / np.sqrt(n), np.unravel_index(
        np.abs(corr).argmax(), corr.shape
    )


def test_a_chain_refuses_two_transforms_drawing_from_one_key():
    from fedjax_dp.privacy.mechanisms.upload_clipping import AdaptiveQuantileClip

    central = dict(count_noise_std=1.0, denominator=4.0)
    with pytest.raises(
        ValueError, match=r"more than one transform draws from the \['CLIP_ADAPTATION'\] key"
    ):
        chain(
            AdaptiveQuantileClip(**central),
            PerLayerQuantileClip(initial_layer_norms=(1.0,), **central),
            GaussianNoise(),
            fixed_denominator(4.0),
        )
    chain(
        PerLayerQuantileClip(initial_layer_norms=(1.0,), local=True, **central),
        GaussianNoise(local=True),
        fixed_denominator(4.0),
    )  # count key and noise key: one consumer each


def test_an_algorithm_whose_steps_draw_client_noise_refuses_local_upload_noise():
    from fedjax_dp.core.algorithm import Requirements
    from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip

    # as ldp_minibatch declares
    step_noise = type("StepNoise", (), {"requirements": Requirements(step_noise=True)})()
    uploads = chain(FlatClip(1.0), GaussianNoise(local=True), fixed_denominator(4.0))
    with pytest.raises(
        ValueError, match="draws its local steps' noise from each client's noise key"
    ):
        round_lib.FederatedRound(step_noise, uploads)
    round_lib.FederatedRound(
        step_noise, chain(FlatClip(1.0), GaussianNoise(), fixed_denominator(4.0))
    )
