"""What every config key means (``fedjax-dp --help`` prints these beside the defaults): the generic
sections' here, the ``privacy`` section's from ``privacy.settings``, and each algorithm's section
from where it is registered (``registry.register_section(docs=...)``): adding an algorithm edits no
file of ``training/``. A test checks that each key of ``default_config()`` has its line and that no
line is stale."""

from __future__ import annotations

from fedjax_dp.algorithms import registry
from fedjax_dp.core import config_sections
from fedjax_dp.privacy.settings import DOCS as PRIVACY_DOCS

GENERIC_DOCS = {
    "seed": (
        "seed of every random stream (model init, sampling, shuffles, noise; see"
        " privacy.secure_rng)"
    ),
    "rounds": "federated rounds T",
    "eval_every": "evaluate the global (and personalised) models every this many rounds",
    "divergence_rounds": (
        "stop the run, DP or not, once the training loss is non-finite or 1e6 x round 1's for this"
        " many rounds in a row (training.divergence; the CLI exits 3); 0 turns the rule off"
    ),
    "eval_initial": "also evaluate the initial model, logged as round 0",
    "eval_client_data": (
        "score models on the clients' own test data too (per-client and personalised accuracy,"
        " client_accuracies.json: outside the DP guarantee, listed in privacy.json); False keeps"
        " every published figure inside it"
    ),
    "eval_prototypes": (
        "also report the personalised accuracy of each client's prototype classifier on the global "
        "model's penultimate features (Proto adaptation: seed 004's metric for SCAFFOLD); for "
        "algorithms without their own personalised models"
    ),
    "checkpoint_every": "orbax checkpoint every k rounds (0: only at exit); continue with --resume",
    "checkpoint_keep": (
        "how many of the newest checkpoints to keep (0: every one, e.g. to analyse each round's"
        " model afterwards)"
    ),
    "data.source": (
        "mnist_5k (embedded, no download) | mnist | cifar10 | cifar100 | femnist | shakespeare |"
        " tfds:<name> | yours (fedjax_dp.register_data, --import: it gives its own clients)"
    ),
    "data.data_dir": "folder of the local files, or the TFDS data_dir",
    "data.cache_dir": (
        "decoded-array cache: '' = $FEDJAX_DP_CACHE or ~/.cache/fedjax_dp, 'off' = none"
    ),
    "data.download": "TFDS only: allow downloading",
    "data.manual_dir": "TFDS only: manual download folder",
    "data.normalize": (
        "none ([0, 1] pixels) | channel: (x - mean) / std per colour channel with the dataset's"
        " published constants (cifar10, cifar100, mnist, mnist_5k and their tfds: sources), as"
        " PFLDyn's authors do; no privacy cost"
    ),
    "data.augment": (
        "none | crop_flip: every drawn training image randomly cropped after zero padding of 4 and"
        " flipped left-right (CIFAR sources only), as PFLDyn's authors do; evaluation data never"
    ),
    "data.partition": (
        "iid | shards (McMahan's label shards) | dirichlet | iid_split | acid | alid | natural (by"
        " writer/role)"
    ),
    "data.num_clients": "number of clients K (a source that gives its own clients: their number)",
    "data.shards_per_client": "shards partition: label-sorted shards per client",
    "data.alpha": "dirichlet partition: concentration (smaller = more skewed)",
    "data.test_fraction": "fraction of each client's examples held out as its own test data",
    "data.classes_per_client": "acid / alid partitions: classes each client holds",
    "data.max_train_per_client": "acid / alid: cap on a client's training examples (0 = none)",
    "data.min_train_per_client": (
        "natural: select only writers / roles with at least this many training examples (0 = all)"
    ),
    "data.max_test_per_client": "acid / alid: cap on a client's test examples (0 = none)",
    "data.invert": "femnist: invert the pixel convention",
    "data.sequence_length": "shakespeare: characters per training window",
    "model.name": (
        "logistic | mlp_2nn | mlp_600_100 | cnn_fedavg | cnn_pfl | vgg16 | vgg16_gn (VGG16 +"
        " GroupNorm) | char_gru (GRU 256 x 2) | char_gru_small (one GRU of 128) | yours"
        " (fedjax_dp.register_model, --import)"
    ),
    "model.compute_dtype": (
        "'' (float32) or 'bfloat16' (mixed precision; parameters and DP noise stay float32)"
    ),
    "client.optimizer": "local optimizer: sgd (with client.momentum) | adam",
    "client.learning_rate": "local learning rate eta",
    "client.momentum": "local momentum (sgd with momentum > 0)",
    "client.batch_size": (
        "local batch size B (with client.epochs, B at or above a client's data size is its whole"
        " data: one step an epoch)"
    ),
    "client.epochs": "local epochs E",
    "client.lr_decay": "local learning rate x lr_decay**t in round t",
    "client.weight_decay": (
        "local L2 weight decay: weight_decay * w added to every local step's gradient (0 = off)"
    ),
    "client.grad_clip_norm": (
        "clip every local step's gradient to this global L2 norm before the step (0 = off; "
        "FedDyn's code uses 10); training only, not a DP clip"
    ),
    "server.optimizer": (
        "server optimizer applied to the aggregate (FedOpt): sgd (with server.momentum) | adam"
    ),
    "server.learning_rate": "server learning rate eta_g (1.0 with sgd = plain FedAvg)",
    "server.momentum": "server momentum",
    "server.lr_decay": "server learning rate x lr_decay**t in round t",
    "server_data.fraction": (
        "server-held set (FedMeta's D_meta, FedShare's shared set): fraction of training examples"
    ),
    "server_data.overlap": (
        "< 0: drawn IID from the clients (no formal DP); 0-1: writer overlap on natural partitions "
        "(0 keeps the guarantee)"
    ),
    "server_data.num_writers": "writers drawn for the server-held set on natural partitions",
    "engine.strategy": (
        "how clients run: auto | vmap | chunked | sequential | loop (same numbers, different speed)"
    ),
    "engine.chunk_size": "chunked strategy: clients per vmapped chunk",
    "engine.unroll": "local-training scan unroll: auto | full | an integer",
    "engine.conv_impl": (
        "convolutions: auto | xla | im2col | space_to_depth (a thin first layer on 2x2 blocks, XLA"
        " elsewhere; opt-in) | per_layer (each layer by its shape)"
    ),
    "engine.num_devices": (
        "spread the cohort over this many devices: loop, clients round-robin; vmap / chunked / "
        "sequential, a mesh (0 = auto: a CPU device per core for auto's loop, else one)"
    ),
    "engine.stream_clients": (
        "send the cohort to the device this many clients at a time, so device memory is "
        "bounded by the slice, not the cohort (0 = all at once)"
    ),
    "engine.max_replicated_gb": (
        "spread over devices only while the copies of the round's shared inputs (model, state, held"
        " random matrices) on the other devices fit this many GB; else one device (same numbers,"
        " slower)"
    ),
    "engine.deferred_dense": (
        "on: plain-SGD clients update a large dense kernel once, at the end of local training, "
        "from the layer's inputs and output gradients (core/deferred_dense.py; equal up to float "
        "rounding) | auto: on CPU and GPU backends (where it was measured) | off"
    ),
}


def key_docs() -> dict[str, str]:
    """Every documented key: generic, privacy and the registered sections'."""
    algorithms = {"algorithm": " | ".join(registry.names()) + " (algorithms.registry.names())"}
    return {**GENERIC_DOCS, **algorithms, **PRIVACY_DOCS, **config_sections.docs()}


class _KeyDocs(dict):
    """``KEY_DOCS`` read at use, so sections registered after import (a test's toy algorithm) are in
    it."""

    def _all(self):
        return key_docs()

    def __getitem__(self, key):
        return self._all()[key]

    def __contains__(self, key):
        return key in self._all()

    def get(self, key, default=None):
        return self._all().get(key, default)

    def keys(self):
        return self._all().keys()

    def items(self):
        return self._all().items()

    def __iter__(self):
        return iter(self._all())

    def __len__(self):
        return len(self._all())


KEY_DOCS = _KeyDocs()


def describe_keys(cfg=None) -> str:
    """Every key of ``cfg`` (default: ``default_config()``) with its default and meaning, one per
    line."""
    from fedjax_dp.configs import all_keys
    from fedjax_dp.training.default_config import default_config

    cfg = default_config() if cfg is None else cfg
    lines = []
    for key in all_keys(cfg):
        value = cfg
        for part in key.split("."):
            value = value[part]
        lines.append(f"  {key + '=' + repr(value):<40} {KEY_DOCS.get(key, '(undocumented)')}")
    return "\n".join(lines)
