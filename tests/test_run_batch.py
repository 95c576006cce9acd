"""Seeds in lockstep through one vmapped program (``fedjax_dp.training.run_batch``): each run's
numbers equal its run alone up to float32 rounding (epsilon exactly), configs that cannot be
batched run one after another with the same numbers bit for bit, and the refusals."""

import json

import numpy as np
import pytest

import fedjax_dp
from fedjax_dp.cli import main
from fedjax_dp.training.loop import run_experiment
from fedjax_dp.training import run_batch
from fedjax_dp.training.run_batch import run_batched
from test_hypergrad import _config

SEEDS = (0, 1, 2)


def _rows(workdir):
    with open(workdir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def _seed_configs(algorithm, rounds=4):
    configs = []
    for seed in SEEDS:
        cfg = _config(algorithm)
        cfg.seed, cfg.rounds, cfg.eval_every = seed, rounds, 2
        configs.append(cfg)
    return configs


@pytest.mark.parametrize("algorithm", ["fedavg", "dp_fedavg"])
def test_batched_seeds_equal_their_runs_alone(tmp_path, algorithm):
    configs = _seed_configs(algorithm)
    alone = [run_experiment(c, str(tmp_path / f"alone{c.seed}"), progress=False) for c in configs]
    batched = run_batched(configs, [str(tmp_path / f"batch{c.seed}") for c in configs])
    for seed, a, b in zip(SEEDS, alone, batched):
        assert a.epsilon == b.epsilon and a.formal == b.formal
        rows_a, rows_b = _rows(tmp_path / f"alone{seed}"), _rows(tmp_path / f"batch{seed}")
        assert [r["round"] for r in rows_a] == [r["round"] for r in rows_b]
        for ra, rb in zip(rows_a, rows_b):
            assert ra.get("cohort_size") == rb.get("cohort_size")
            assert ra.get("epsilon") == rb.get("epsilon")
            for key in ("train_loss", "test_loss", "test_accuracy"):
                if key in ra:  # float32 rounding of a batched matmul's sums
                    np.testing.assert_allclose(rb[key], ra[key], rtol=2e-5, atol=1e-6)
    finals = [b.final["test_accuracy"] for b in batched]
    assert len(set(finals)) > 1  # the seeds are different runs


def test_a_config_that_cannot_be_batched_runs_its_seeds_one_after_another(tmp_path, caplog):
    configs = _seed_configs("scaffold", rounds=2)[:2]
    alone = [run_experiment(c, str(tmp_path / f"alone{c.seed}"), progress=False) for c in configs]
    run_batched(configs, [str(tmp_path / f"batch{c.seed}") for c in configs])
    assert "not batched: the algorithm keeps per-client state" in caplog.text
    for seed, a in zip(SEEDS, alone):
        rows_a, rows_b = _rows(tmp_path / f"alone{seed}"), _rows(tmp_path / f"batch{seed}")
        strip = lambda rows: [{k: v for k, v in r.items() if "seconds" not in k} for r in rows]  # noqa: E731
        assert strip(rows_a) == strip(rows_b)


def test_batched_runs_differ_only_in_their_seed_and_scalar_settings(tmp_path):
    configs = _seed_configs("fedavg")[:2]
    configs[1].client.epochs = 2
    with pytest.raises(ValueError, match="config 1 differs from config 0 in client.epochs: 2"):
        run_batched(configs, [str(tmp_path / "a"), str(tmp_path / "b")])
    # a batchable key that differs first (in key order) does not hide one that may not
    configs[1].client.epochs, configs[1].client.learning_rate = 1, 0.5
    configs[1].sampling.cohort_size = 5
    with pytest.raises(ValueError, match="differs from config 0 in sampling.cohort_size: 5"):
        run_batched(configs, [str(tmp_path / "a"), str(tmp_path / "b")])


SETTINGS = (  # seed, clip norm, client lr, server lr, z
    (0, 0.5, 0.05, 1.0, 1.0),
    (1, 1.0, 0.2, 0.5, 0.7),
    (0, 0.25, 0.1, 2.0, 1.3),
)


def _settings_configs(algorithm="dp_fedavg", rounds=4):
    configs = []
    for seed, clip, client_lr, server_lr, z in SETTINGS:
        cfg = _config(algorithm)
        cfg.seed, cfg.rounds, cfg.eval_every = seed, rounds, 2
        cfg.client.learning_rate, cfg.server.learning_rate = client_lr, server_lr
        cfg.dp.update(clip_norm=clip, noise_multiplier=z)
        configs.append(cfg)
    return configs


def _count_programs(monkeypatch):
    built = []
    original = run_batch._program
    monkeypatch.setattr(
        run_batch, "_program", lambda *a: built.append(a[-1] is not None) or original(*a)
    )
    return built


def test_runs_differing_in_scalar_settings_train_as_one_program(tmp_path, monkeypatch):
    """Seed, clip norm, client and server learning rates and z differ: one program, each run's
    numbers its own up to float32 rounding, its epsilon exactly."""
    built = _count_programs(monkeypatch)
    configs = _settings_configs()
    alone = [
        run_experiment(c, str(tmp_path / f"alone{i}"), progress=False)
        for i, c in enumerate(configs)
    ]
    batched = run_batched(configs, [str(tmp_path / f"batch{i}") for i in range(len(configs))])
    assert built == [True]  # one program, its learning rates traced
    for i, (a, b) in enumerate(zip(alone, batched)):
        assert a.epsilon == b.epsilon
        rows_a, rows_b = _rows(tmp_path / f"alone{i}"), _rows(tmp_path / f"batch{i}")
        assert [r["round"] for r in rows_a] == [r["round"] for r in rows_b]
        for ra, rb in zip(rows_a, rows_b):
            for key in ("clip_norm", "noise_multiplier", "cohort_size"):
                assert ra.get(key) == rb.get(key)
            for key in ("train_loss", "test_loss", "test_accuracy"):
                if key in ra:
                    np.testing.assert_allclose(rb[key], ra[key], rtol=2e-5, atol=1e-6)
    assert len({a.epsilon for a in alone}) == 3 and len({a.final["test_loss"] for a in alone}) == 3


def test_runs_whose_chains_differ_in_a_constant_train_apart(tmp_path, monkeypatch):
    """Per-layer clip norms are constants of the program: runs with other clip norms cannot share
    it, so each trains alone (bit for bit its run alone)."""
    built = _count_programs(monkeypatch)
    configs = _settings_configs(rounds=2)[:2]
    for cfg in configs:
        cfg.dp.clip = "per_layer"
    for i, cfg in enumerate(configs):
        run_experiment(cfg, str(tmp_path / f"alone{i}"), progress=False)
    run_batched(configs, [str(tmp_path / f"batch{i}") for i in range(2)])
    assert built == []
    strip = lambda rows: [{k: v for k, v in r.items() if "seconds" not in k} for r in rows]  # noqa: E731
    for i in range(2):
        assert strip(_rows(tmp_path / f"alone{i}")) == strip(_rows(tmp_path / f"batch{i}"))


def test_scalar_settings_of_an_algorithm_without_traced_rates_run_one_after_another(
    tmp_path, caplog
):
    configs = _seed_configs("fedshare", rounds=1)[:2]
    configs[1].client.learning_rate = 0.2
    run_batched(configs, [str(tmp_path / "a"), str(tmp_path / "b")])
    assert "not batched: the runs differ in client.learning_rate, which fedshare" in caplog.text


def test_run_seeds_vectorized_writes_the_seeds_summary(tmp_path):
    cfg = _seed_configs("fedavg", rounds=2)[0]
    summary = fedjax_dp.Experiment(cfg).run_seeds([0, 1], str(tmp_path), vectorized=True)
    assert summary.seeds == [0, 1]
    assert (tmp_path / "seeds_summary.json").exists() and (
        tmp_path / "seed_1" / "summary.json"
    ).exists()
    with pytest.raises(ValueError, match="vectorized=True\\) with tensorboard=True"):
        fedjax_dp.Experiment(cfg).run_seeds([0, 1], str(tmp_path / "x"), True, tensorboard=True)


def test_the_cli_refuses_vectorize_without_seeds(capsys):
    assert main(["fedjax-dp", "--config", "fedavg_mnist", "--vectorize"]) == 2
    assert "--vectorize trains several runs at once" in capsys.readouterr().err


def test_a_compiled_program_keeps_the_rates_of_the_run_it_was_built_from(monkeypatch):
    """A later round's group may lead with another run (an earlier first run has stopped): the
    program compiled from the first run is reused, so the traced factors stay relative to that
    run's learning rates, not the new leader's."""
    import math
    from types import SimpleNamespace

    from fedjax_dp.core.uploads import Chain
    from fedjax_dp.privacy.mechanisms.upload_clipping import FlatClip
    from fedjax_dp.training.default_config import default_config

    def run(client_lr, server_lr):
        cfg = default_config()
        cfg.client.learning_rate, cfg.server.learning_rate = client_lr, server_lr
        return SimpleNamespace(cfg=cfg)

    monkeypatch.setattr(run_batch, "_program", lambda first, *a: object())
    runs = [run(0.05, 1.0), run(0.2, 0.5), run(0.1, 2.0)]
    programs, uploads = {}, Chain((FlatClip(0.5),))
    first, _ = run_batch._program_for(
        programs, runs, [(0, None), (1, None), (2, None)], ("s",), uploads, "t", (True,)
    )
    again, rates = run_batch._program_for(
        programs, runs, [(1, None), (2, None)], ("s",), uploads, "t", (True,)
    )
    assert again is first
    np.testing.assert_allclose(rates["client_lr"], [math.log(0.2 / 0.05), math.log(0.1 / 0.05)])
    np.testing.assert_allclose(rates["server_lr"], [math.log(0.5), math.log(2.0)])
    # a program that does not trace the rates is reused only by runs at its own rates
    same = [run(0.2, 0.5), run(0.2, 0.5), run(0.1, 1.0), run(0.1, 1.0)]
    one, none = run_batch._program_for(programs, same, [(0, 0), (1, 0)], ("s",), uploads, "t", ())
    other, _ = run_batch._program_for(programs, same, [(2, 0), (3, 0)], ("s",), uploads, "t", ())
    assert none is None and other is not one
