"""Short seeded runs of every configuration the library had before the algorithm-protocol refactor
(issue 15), and of the algorithms added after it (``later_configs``: recorded at 4877358,
2026-12-02, so that the next refactor has them too), whose ``metrics.jsonl`` and ``privacy.json``
are committed beside this file.

``test_golden.py`` re-runs each and compares; ``python -m tests.golden.record`` rewrites the files
(only when a change of numbers is intended, and then say why in the commit). Every run is tiny: the
embedded MNIST subset, 12 clients, logistic regression, 3 rounds of 4 clients (the later ones: 10
clients, a quarter of each one's examples its test set, 2-3 local steps).
"""

from __future__ import annotations

from fedjax_dp.training.default_config import default_config


def _base():
    c = default_config()
    c.seed, c.rounds, c.eval_every = 3, 3, 2
    c.data.num_clients = 12
    c.model.name = "logistic"
    c.client.update(epochs=1, batch_size=32, learning_rate=0.1)
    c.sampling.cohort_size = 4
    c.engine.strategy = "vmap"
    c.engine.unroll = "1"
    return c


def _dp(clip="fixed", noise_mode="central", **dp):
    """DP-FedAvg; the keyword arguments of the ``privacy`` section (issue 73: delta, accountant,
    budgets, stops) go there, the rest to ``dp`` (the runs were recorded when all of them were
    ``dp`` keys)."""
    c = _base()
    c.algorithm = "dp_fedavg"
    privacy = {k: v for k, v in dp.items() if k in c.privacy}
    c.dp.update(
        {
            "clip": clip,
            "noise_mode": noise_mode,
            "clip_norm": 0.5,
            "noise_multiplier": 0.8,
            **{k: v for k, v in dp.items() if k not in privacy},
        }
    )
    c.privacy.update(privacy)
    return c


def _with(c, **fields):
    for path, value in fields.items():
        section, _, key = path.rpartition("__")
        (c[section] if section else c)[key] = value
    return c


def configs() -> dict:
    """name -> config; each one a configuration that existed before the refactor."""
    out = {
        "fedavg": _base(),
        "fedavg_poisson": _with(_base(), sampling__method="poisson", sampling__rate=0.3),
        "fedavg_server_momentum": _with(
            _base(), server__momentum=0.9, server__learning_rate=0.5, client__lr_decay=0.9
        ),
        "fedprox": _with(_base(), algorithm="fedprox", fedprox__mu=0.5),
        "fedshare": _with(_base(), algorithm="fedshare", server_data__fraction=0.02),
        "uga": _with(_base(), algorithm="uga", client__epochs=2, server__learning_rate=0.5),
        "uga_remat_first_order": _with(
            _base(),
            algorithm="uga",
            client__epochs=2,
            uga__remat="step",
            uga__first_order=True,
            uga__gradient_reduction="sum_of_batch_means",
        ),
        "fedmeta": _with(
            _base(),
            fedmeta__enabled=True,
            fedmeta__learning_rate=0.05,
            fedmeta__steps=2,
            server_data__fraction=0.02,
        ),
        "fedmeta_uga": _with(
            _base(),
            algorithm="uga",
            client__epochs=2,
            fedmeta__enabled=True,
            fedmeta__learning_rate=0.05,
            server_data__fraction=0.02,
        ),
        "scaffold": _with(_base(), algorithm="scaffold", rounds=4),
        "dp_central_fixed": _dp(),
        "dp_central_per_layer": _dp("per_layer"),
        "dp_central_adaptive": _dp("adaptive", target_quantile=0.7, clip_learning_rate=0.3),
        "dp_central_median": _dp("median"),
        "dp_local_fixed": _dp(noise_mode="local"),
        "dp_local_per_layer": _dp("per_layer", noise_mode="local"),
        "dp_poisson_pld": _with(
            _dp(accountant="pld"), sampling__method="poisson", sampling__rate=0.3
        ),
        "dp_schedule_budget": _dp(noise_schedule="1:0.8,2:1.2", max_epsilon=30.0),
        "dp_geyer_stop": _with(
            _dp(stop_epsilon=6.0, stop_max_delta=1e-5, noise_multiplier=2.5), rounds=8
        ),
        "dp_client_budget": _with(_dp(client_epsilon_budget=6.0, noise_multiplier=2.0), rounds=6),
        "dp_calibrated": _dp(target_epsilon=5.0),
        "dp_uga": _with(_dp(), algorithm="dp_uga", client__epochs=2),
        "dp_fedmeta": _with(
            _dp(), fedmeta__enabled=True, fedmeta__learning_rate=0.05, server_data__fraction=0.02
        ),
        "compression_dynamic": _with(_base(), compression__enabled=True),
        "compression_gaussian_fixed": _with(
            _base(),
            compression__enabled=True,
            compression__kind="gaussian",
            compression__rates="0.4",
        ),
        "compression_uga_ista": _with(
            _base(),
            algorithm="uga",
            client__epochs=2,
            compression__enabled=True,
            compression__rates="0.5",
            compression__method="ista_dct",
        ),
    }
    return out


def _later(algorithm, **fields):
    """The algorithms registered after the refactor, as their tests run them
    (tests/test_pfldyn_cuag.py, tests/test_dp_baselines.py, tests/test_ldp_minibatch.py): 10
    clients, 4 a round, 3 rounds."""
    c = _base()
    c.algorithm, c.eval_every = algorithm, 3
    c.data.update(num_clients=10, test_fraction=0.25)
    c.client.update(batch_size=8)
    if algorithm in ("pfldyn_proto", "cuag_pfl", "prifedsync"):
        c.pfldyn.local_steps = 2
    if algorithm == "dp_scaffold":
        c.dp_scaffold.local_steps = 3
    return _with(c, **fields)


def later_configs() -> dict:
    """name -> config; the algorithms and DP modes added after the refactor (seed 003 and seed
    004)."""
    return {
        "pfldyn_proto": _later("pfldyn_proto"),
        "pfldyn_proto_population_penultimate": _later(
            "pfldyn_proto",
            pfldyn__server_mean="population",
            pfldyn__representation="penultimate",
            model__name="mlp_2nn",
        ),
        "cuag_pfl_paper": _later("cuag_pfl", compression__enabled=True),
        "cuag_pfl_sound": _later(
            "cuag_pfl", compression__enabled=True, cuag__mode="sound", cuag__participations=2
        ),
        "cuag_pfl_sound_client_mu": _later(
            "cuag_pfl",
            compression__enabled=True,
            cuag__mode="sound",
            cuag__client_mu="0.5,4",
            cuag__participations=2,
        ),
        "cuag_pfl_sound_adaptive_clip": _later(
            "cuag_pfl",
            compression__enabled=True,
            cuag__mode="sound",
            cuag__participations=2,
            cuag__adaptive_clip=True,
            cuag__count_noise_std=12.0,
        ),
        "udp_paper": _later("udp"),
        "udp_sound": _later("udp", udp__mode="sound", udp__participations=2),
        "prifedsync": _later("prifedsync"),
        "dp_scaffold_median": _later("dp_scaffold"),
        "dp_scaffold_fixed_pld": _later(
            "dp_scaffold", dp_scaffold__clip="fixed", privacy__accountant="pld"
        ),
        "ldp_minibatch": _with(
            _later("ldp_minibatch", server_data__overlap=0.0),
            ldp__local_steps=3,
            ldp__thresholds="1,3",
        ),
        "ldp_minibatch_mlp_poisson": _with(
            _later("ldp_minibatch", server_data__overlap=0.0, model__name="mlp_2nn"),
            ldp__local_steps=3,
            ldp__thresholds="2",
            ldp__step_sampling="poisson",
        ),
        "ldp_minibatch_cnn_pfl": _with(
            _later("ldp_minibatch", server_data__overlap=0.0, model__name="cnn_pfl"),
            ldp__local_steps=2,
            ldp__thresholds="3",
        ),
        "dp_scaffold_cnn_pfl": _later(
            "dp_scaffold", model__name="cnn_pfl", dp_scaffold__clip="fixed"
        ),
    }


def all_configs() -> dict:
    """Both sets: what ``test_golden.py`` runs and ``record.py`` writes."""
    return {**configs(), **later_configs()}
