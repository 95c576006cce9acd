"""Algorithms from configuration: FedAvg, FedProx, FedShare, UGA, SCAFFOLD, DP-FedAvg, DP-UGA, each optionally
wrapped in FedMeta (``fedmeta.enabled``). FedShare's shared set and FedMeta's D_meta come from
``data.builders.build_server_set``."""

from __future__ import annotations

from fedjax_dp.algorithms.dp_fedavg import DPFedAvg
from fedjax_dp.algorithms.fedavg import FedAvg
from fedjax_dp.algorithms.fedmeta import FedMeta
from fedjax_dp.algorithms.fedprox import FedProx
from fedjax_dp.algorithms.scaffold import Scaffold
from fedjax_dp.algorithms.uga import UGA, as_client_delta, make_uga_gradient
from fedjax_dp.core.cohort import client_mesh
from fedjax_dp.core.strategy import StrategyChoice
from fedjax_dp.training.optimizers import build_optimizer

ALGORITHMS = ("fedavg", "fedprox", "fedshare", "uga", "scaffold", "dp_fedavg", "dp_uga")
DP_ALGORITHMS = ("dp_fedavg", "dp_uga")
SERVER_SET_USERS = ("fedshare",)  # plus any algorithm with fedmeta.enabled


def expected_cohort(cfg, num_clients: int) -> float:
    return cfg.sampling.cohort_size if cfg.sampling.method == "uniform" else cfg.sampling.rate * num_clients


def needs_server_set(cfg) -> bool:
    return cfg.algorithm in SERVER_SET_USERS or bool(cfg.fedmeta.enabled)


def remat_option(text: str):
    """Config ``uga.remat`` -> ``make_local_trainer``'s ``remat`` (off, step, sqrt or a segment length)."""
    text = str(text)
    if text in ("off", "step", "sqrt"):
        return {"off": False, "step": True, "sqrt": "sqrt"}[text]
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"uga.remat must be off, step, sqrt or a segment length >= 1, got {text!r}")


def build_algorithm(cfg, model, choice: StrategyChoice, num_clients: int, server_set=None, compressor=None):
    """The configured algorithm; ``server_set`` (a ``ServerSet``) is D_meta when FedMeta is on;
    ``compressor`` (a ``LayerwiseCompressor``) compresses the uploads of the FedAvg family."""
    mesh = client_mesh(cfg.engine.num_devices) if cfg.engine.num_devices else None
    client_optimizer = build_optimizer(cfg.client.optimizer, cfg.client.learning_rate, cfg.client.momentum)
    common = dict(
        per_example_loss=model.per_example_loss, client_optimizer=client_optimizer,
        server_optimizer=build_optimizer(cfg.server.optimizer, cfg.server.learning_rate, cfg.server.momentum,
                                         cfg.server.lr_decay),
        strategy=choice.strategy, chunk_size=choice.chunk_size, unroll=choice.unroll, mesh=mesh)
    uga = cfg.uga
    if cfg.algorithm in ("fedavg", "fedshare"):
        algorithm = FedAvg(**common, client_lr_decay=cfg.client.lr_decay, compressor=compressor)
    elif cfg.algorithm == "fedprox":
        algorithm = FedProx(**common, client_lr_decay=cfg.client.lr_decay, mu=cfg.fedprox.mu, compressor=compressor)
    elif cfg.algorithm == "uga":
        algorithm = UGA(**common, client_lr_decay=cfg.client.lr_decay, remat=remat_option(uga.remat),
                        first_order=uga.first_order, gradient_reduction=uga.gradient_reduction, compressor=compressor)
    elif cfg.algorithm == "scaffold":
        if cfg.client.optimizer != "sgd" or cfg.client.momentum:
            raise ValueError("scaffold's control-variate update (option II) assumes plain SGD clients; got "
                             f"client.optimizer={cfg.client.optimizer!r}, client.momentum={cfg.client.momentum}")
        if compressor is not None:
            raise ValueError("compression of SCAFFOLD's two uploads (model and control deltas) is not implemented")
        algorithm = Scaffold(**common, local_learning_rate=cfg.client.learning_rate, num_clients=num_clients,
                             client_lr_decay=cfg.client.lr_decay)
    elif cfg.algorithm in DP_ALGORITHMS:
        dp = cfg.dp
        extra = {}
        if cfg.algorithm == "dp_uga":
            extra = dict(needs_evaluation_pass=True, client_update=as_client_delta(make_uga_gradient(
                model.per_example_loss, client_optimizer, unroll=choice.unroll, remat=remat_option(uga.remat),
                first_order=uga.first_order, reduction=uga.gradient_reduction)))
        algorithm = DPFedAvg(**common, denominator=expected_cohort(cfg, num_clients), clip=dp.clip,
                             clip_norm=dp.clip_norm, noise_mode=dp.noise_mode, target_quantile=dp.target_quantile,
                             clip_learning_rate=dp.clip_learning_rate, **extra)
    else:
        raise ValueError(f"unknown algorithm {cfg.algorithm!r}; available: {ALGORITHMS}")
    if not cfg.fedmeta.enabled:
        return algorithm
    if server_set is None:
        raise ValueError("fedmeta.enabled needs a server-held set D_meta (server_data)")
    meta = cfg.fedmeta
    return FedMeta(algorithm, model.per_example_loss, server_set.x, server_set.y, meta.learning_rate,
                   meta.steps, meta.lr_decay, meta.batch_size)
