"""Every configuration value an experiment can set, with its default; the shipped configs
(``fedjax_dp/configs/``) start from ``default_config()`` and change what they need. The config comes
back locked: assigning a key it does not have raises, naming the closest one
(``ml_collections``)."""

import ml_collections

import fedjax_dp.algorithms  # noqa: F401  (registers every algorithm)
import fedjax_dp.compression  # noqa: F401  (registers the compression section)
import fedjax_dp.hypergrad  # noqa: F401  (registers the hypergrad section)
import fedjax_dp.privacy.audit  # noqa: F401  (registers the audit section)
import fedjax_dp.privacy.sampling  # noqa: F401  (registers every sampler)
from fedjax_dp.core import config_sections
from fedjax_dp.privacy import settings as privacy_settings


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.rounds = 100
    c.eval_every = 5
    c.eval_initial = True  # evaluate the initial model as round 0 (metrics.jsonl, the plots)
    # False: no figure from the clients' own data (per-client, personalised) is computed
    c.eval_client_data = True
    # also score each client's prototype classifier on the global model's features
    c.eval_prototypes = False
    # stop once the training loss is non-finite or 1e6x round 1's this many rounds running; 0: off
    c.divergence_rounds = 5
    c.checkpoint_every = 0  # > 0: checkpoint every k rounds (always at exit); resume with --resume
    # the newest k checkpoints are kept; 0 keeps every one (for analysing each round after)
    c.checkpoint_keep = 2
    # any registered name: algorithms.registry.names()
    c.algorithm = fedjax_dp.algorithms.DEFAULT_ALGORITHM
    c.data = ml_collections.ConfigDict(
        dict(
            # mnist_5k | mnist | cifar10 | cifar100 | femnist | shakespeare | tfds:<name>
            source="mnist_5k",
            # folder of the local files (configs: $FEDJAX_DP_DATA/<dataset>) or TFDS data_dir
            data_dir="",
            # decoded-array cache: "" = $FEDJAX_DP_CACHE or ~/.cache/fedjax_dp, "off" = none
            cache_dir="",
            download=False,
            manual_dir="",  # TFDS only
            partition="shards",  # iid | shards | dirichlet | iid_split | acid | alid | natural
            num_clients=100,
            shards_per_client=2,
            alpha=0.5,
            test_fraction=0.2,
            classes_per_client=3,
            max_train_per_client=0,
            max_test_per_client=0,  # acid / alid
            # natural: only writers / roles with at least this many training examples
            min_train_per_client=0,
            invert=False,
            sequence_length=80,  # femnist pixel convention; shakespeare window
            # none | channel: (x - mean) / std per channel, published constants
            # (data/normalization.py)
            normalize="none",
            # none | crop_flip: each drawn CIFAR training image cropped (padding 4) and flipped
            augment="none",
        )
    )
    # "bfloat16": mixed precision
    c.model = ml_collections.ConfigDict(dict(name="mlp_2nn", compute_dtype=""))
    c.client = ml_collections.ConfigDict(
        dict(
            optimizer="sgd",
            learning_rate=0.05,
            momentum=0.0,
            batch_size=10,
            epochs=5,
            lr_decay=1.0,  # client lr x lr_decay**t in round t
            weight_decay=0.0,
            grad_clip_norm=0.0,
        )
    )
    c.server = ml_collections.ConfigDict(
        dict(optimizer="sgd", learning_rate=1.0, momentum=0.0, lr_decay=1.0)
    )
    c.server_data = ml_collections.ConfigDict(
        dict(
            # a server-held set (D_meta, a shared set): this fraction of the training examples
            fraction=0.01,
            # < 0: IID from the training clients; [0, 1]: writer overlap (natural partitions)
            overlap=-1.0,
            num_writers=20,
        )
    )
    # delta, accountant, budgets, stops, secure RNG
    c.privacy = ml_collections.ConfigDict(dict(privacy_settings.SECTION))
    c.engine = ml_collections.ConfigDict(
        dict(
            strategy="auto",
            chunk_size=0,
            unroll="auto",
            conv_impl="auto",
            num_devices=0,
            stream_clients=0,
            max_replicated_gb=1.0,
            deferred_dense="auto",
        )
    )
    # each owned section: the algorithms' and wrappers', sampling's, compression's
    for name, section in config_sections.sections().items():
        c[name] = ml_collections.ConfigDict(dict(section.defaults))
    c.lock()
    return c


# lets ``ml_collections.config_flags`` load this file (the CLI's default)
get_config = default_config
