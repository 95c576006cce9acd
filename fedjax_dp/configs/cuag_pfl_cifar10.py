"""CUAG-PFL (compressed, adaptively noised personalised FL) on CIFAR-10 ACID-3 (Table 2 setting).

CUAG-PFL on CIFAR-10 ACID-3 (seed 004 §7, Table 2): N = 100 clients, lambda = 0.1 (10 a round), T =
300, P = 25 local steps of two batches of B = 50, beta = 0.1 decaying 0.997 a round, alpha = 0.1,
weight decay 1e-3 (the seed: the same for every method), the seed-004 CNN (``cnn_pfl``), Alg. 2
dynamic rates in [0.2, 0.5] with the Alg. 3 block operator, Alg. 4 noise as written
(``cuag.mode='paper'``: NO formal guarantee, labelled) at mu = 0.25.

    fedjax-dp --config cuag_pfl_cifar10 --config.cuag.mode=sound
    fedjax-dp --config cuag_pfl_cifar10 --config.algorithm=pfldyn_proto \\
        --config.compression.enabled=False      # the utility upper bound, PFLDyn(Proto)

Needs the CIFAR-10 files (``data.data_dir``); ``data.source='cifar100'`` for CIFAR-100
(non-canonical split, see ``fedjax_dp.data.cifar_files``).

``cuag_pfl_cifar10:authors`` adds what PFLDyn's authors' code does and the seed does not say
(``alpemreacar/PFL``; experiments/RESULTS.md, seed 004, "The PFLDyn authors' code"): inputs
standardised per channel, every local step's gradient clipped to norm 10, the server's g as FedDyn's
population mean, prototypes on the penultimate layer. Without them compression alone collapses the
CIFAR-100 representation for 30-50 rounds; with them it does not (same file, "Why CIFAR-100
collapses")."""

from fedjax_dp.data.local_files import default_data_dir as data_dir
from fedjax_dp.training.default_config import default_config

VARIANTS = ("", "authors")


def get_config(variant: str = ""):
    if variant not in VARIANTS:
        raise ValueError(
            f"cuag_pfl_cifar10:{variant}: unknown variant {variant!r}; available: 'authors' (or"
            " none)"
        )
    c = default_config()
    c.algorithm = "cuag_pfl"
    c.rounds, c.eval_every = 300, 10
    c.data.update(
        source="cifar10",
        data_dir=data_dir("cifar10"),
        partition="acid",
        num_clients=100,
        classes_per_client=3,
    )
    c.model.name = "cnn_pfl"
    # every method's
    c.client.update(batch_size=50, learning_rate=0.1, lr_decay=0.997, weight_decay=1e-3)
    c.pfldyn.update(alpha=0.1, local_steps=25)
    c.compression.update(enabled=True, kind="block", rates="dynamic", r_min=0.2, r_max=0.5)
    c.cuag.update(mode="paper", mu=0.25)
    c.privacy.delta = 1e-5
    c.sampling.cohort_size = 10
    if variant == "authors":
        c.data.normalize = "channel"
        c.client.grad_clip_norm = 10.0
        c.pfldyn.update(server_mean="population", representation="penultimate")
    return c
