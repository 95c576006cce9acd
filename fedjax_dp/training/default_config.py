"""Every configuration value an experiment can set, with its default; configs in
``experiments/configs/`` start from ``default_config()`` and change what they need."""

import ml_collections


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.rounds = 100
    c.eval_every = 5
    c.checkpoint_every = 0  # > 0: checkpoint every k rounds (always at exit); resume with --resume
    c.algorithm = "fedavg"  # fedavg | fedprox | fedshare | uga | dp_fedavg | dp_uga
    c.data = ml_collections.ConfigDict(dict(
        source="mnist_5k",      # mnist_5k | mnist | cifar10 | femnist | shakespeare | tfds:<name>
        data_dir="",            # folder of the local files (../shared/data/<dataset> here) or TFDS data_dir
        cache_dir="",           # decoded-array cache: "" = $FEDJAX_DP_CACHE or ~/.cache/fedjax_dp, "off" = none
        download=False, manual_dir="",  # TFDS only
        partition="shards",     # iid | shards | dirichlet | iid_split | acid | alid | natural
        num_clients=100, shards_per_client=2, alpha=0.5, test_fraction=0.2,
        classes_per_client=3, max_train_per_client=0, max_test_per_client=0,  # acid / alid
        invert=False, sequence_length=80))  # femnist pixel convention; shakespeare window
    c.model = ml_collections.ConfigDict(dict(name="mlp_2nn"))
    c.client = ml_collections.ConfigDict(dict(optimizer="sgd", learning_rate=0.05, momentum=0.0, batch_size=10, epochs=5,
                                              lr_decay=1.0))  # client lr x lr_decay**t in round t
    c.server = ml_collections.ConfigDict(dict(optimizer="sgd", learning_rate=1.0, momentum=0.0, lr_decay=1.0))
    c.fedprox = ml_collections.ConfigDict(dict(mu=2e-4))      # proximal coefficient (seed 002 baseline)
    c.uga = ml_collections.ConfigDict(dict(
        remat="off",            # off | step | sqrt | <k>: checkpoint every step / sqrt(S)-step / k-step segments
        first_order=False,      # stop gradients through inner gradients (first-order UGA)
        gradient_reduction="mean",  # mean (Eq. 13 as written) | sum_of_batch_means (see algorithms.uga.UGA)
        eval_batch_size=0))     # batch of the whole-data gradient evaluation; 0 = client.batch_size
    c.fedmeta = ml_collections.ConfigDict(dict(
        enabled=False,          # meta step(s) on D_meta after every aggregation (wraps any algorithm)
        learning_rate=0.002, steps=1, lr_decay=1.0, batch_size=0))  # batch_size 0: all of D_meta at once
    c.compression = ml_collections.ConfigDict(dict(
        enabled=False,          # compressed-sensing uploads (seed 004; FedAvg, FedProx, FedShare, UGA)
        kind="block",           # block | gaussian | bernoulli measurement operator
        rates="dynamic",        # "dynamic" (Alg. 2) or a fixed rate such as "0.5"
        r_min=0.2, r_max=0.5, method="min_norm", seed=0))  # Alg. 2 bounds; min_norm | ista_dct
    c.server_data = ml_collections.ConfigDict(dict(
        fraction=0.01,          # D_meta / FedShare's shared set: this fraction of the training examples
        overlap=-1.0,           # < 0: IID from the training clients; [0, 1]: writer overlap (natural partitions)
        num_writers=20))
    c.sampling = ml_collections.ConfigDict(dict(method="uniform", cohort_size=10, rate=0.1))
    c.engine = ml_collections.ConfigDict(dict(strategy="auto", chunk_size=0, unroll="auto", conv_impl="auto", num_devices=0))
    c.dp = ml_collections.ConfigDict(dict(
        noise_multiplier=1.0,      # z: noise std on the clipped sum / S
        noise_schedule="",         # piecewise-constant z_t, e.g. "1:1.2,100:1.0"
        calibrate_epsilon=0.0,     # > 0: choose z so that `rounds` rounds spend this epsilon at `delta`
        clip="fixed",              # fixed | per_layer | adaptive | median (median: NOT private)
        clip_norm=1.0,             # S (initial S for adaptive)
        target_quantile=0.5, clip_learning_rate=0.2,  # adaptive clipping (Andrew et al. 2021)
        noise_mode="central",      # central | local
        accountant="rdp",          # rdp | pld (pld needs Poisson sampling)
        delta=1e-5,
        target_epsilon=0.0, max_delta=0.0,   # Geyer's stop: delta(target_epsilon) would exceed Q
        max_epsilon=0.0,                      # stop when epsilon(delta) would exceed this
        client_epsilon_budget=0.0))          # per-client budget (ledger); 0 = none
    return c
