"""What every config key means (``fedjax-dp --help`` prints these beside the defaults). A test checks
that each key of ``default_config()`` has its line here and that no line is stale."""

from __future__ import annotations

KEY_DOCS = {
    "seed": "seed of every random stream (model init, sampling, shuffles, noise; see privacy.secure_rng)",
    "rounds": "federated rounds T",
    "eval_every": "evaluate the global (and personalised) models every this many rounds",
    "divergence_rounds": "stop the run, DP or not, once the training loss is non-finite or 1e6 x round 1's for this many "
                         "rounds in a row (training.divergence; the CLI exits 3); 0 turns the rule off",
    "eval_initial": "also evaluate the initial model, logged as round 0",
    "eval_client_data": "score models on the clients' own test data too (per-client and personalised accuracy, "
                        "client_accuracies.json: outside the DP guarantee, listed in privacy.json); False keeps every "
                        "published figure inside it",
    "eval_prototypes": "also report the personalised accuracy of each client's prototype classifier on the global "
                       "model's penultimate features (Proto adaptation: seed 004's metric for SCAFFOLD); for "
                       "algorithms without their own personalised models",
    "checkpoint_every": "orbax checkpoint every k rounds (0: only at exit); continue with --resume",
    "checkpoint_keep": "how many of the newest checkpoints to keep (0: every one, e.g. to analyse each round's model "
                       "afterwards)",
    "algorithm": "fedavg | fedprox | fedshare | uga | scaffold | dp_fedavg | dp_uga | ldp_minibatch | pfldyn_proto | "
                 "cuag_pfl | udp | prifedsync | dp_scaffold (algorithms.registry.names())",
    "data.source": "mnist_5k (embedded, no download) | mnist | cifar10 | cifar100 | femnist | shakespeare | tfds:<name>",
    "data.data_dir": "folder of the local files, or the TFDS data_dir",
    "data.cache_dir": "decoded-array cache: '' = $FEDJAX_DP_CACHE or ~/.cache/fedjax_dp, 'off' = none",
    "data.download": "TFDS only: allow downloading",
    "data.manual_dir": "TFDS only: manual download folder",
    "data.normalize": "none ([0, 1] pixels) | channel: (x - mean) / std per colour channel with the dataset's published "
                      "constants (cifar10, cifar100, mnist, mnist_5k and their tfds: sources), as PFLDyn's authors do; no privacy cost",
    "data.augment": "none | crop_flip: every drawn training image randomly cropped after zero padding of 4 and flipped "
                    "left-right (CIFAR sources only), as PFLDyn's authors do; evaluation data never",
    "data.partition": "iid | shards (McMahan's label shards) | dirichlet | iid_split | acid | alid | natural (by writer/role)",
    "data.num_clients": "number of clients K",
    "data.shards_per_client": "shards partition: label-sorted shards per client",
    "data.alpha": "dirichlet partition: concentration (smaller = more skewed)",
    "data.test_fraction": "fraction of each client's examples held out as its own test data",
    "data.classes_per_client": "acid / alid partitions: classes each client holds",
    "data.max_train_per_client": "acid / alid: cap on a client's training examples (0 = none)",
    "data.min_train_per_client": "natural: select only writers / roles with at least this many training examples (0 = all)",
    "data.max_test_per_client": "acid / alid: cap on a client's test examples (0 = none)",
    "data.invert": "femnist: invert the pixel convention",
    "data.sequence_length": "shakespeare: characters per training window",
    "model.name": "logistic | mlp_2nn | mlp_600_100 | cnn_fedavg | cnn_pfl | vgg16 | vgg16_gn (VGG16 + GroupNorm) | char_gru",
    "model.compute_dtype": "'' (float32) or 'bfloat16' (mixed precision; parameters and DP noise stay float32)",
    "client.optimizer": "local optimizer: sgd (with client.momentum) | adam",
    "client.learning_rate": "local learning rate eta",
    "client.momentum": "local momentum (sgd with momentum > 0)",
    "client.batch_size": "local batch size B (with client.epochs, B at or above a client's data size is its whole data: one step an epoch)",
    "client.epochs": "local epochs E",
    "client.lr_decay": "local learning rate x lr_decay**t in round t",
    "client.weight_decay": "local L2 weight decay: weight_decay * w added to every local step's gradient (0 = off)",
    "client.grad_clip_norm": "clip every local step's gradient to this global L2 norm before the step (0 = off; "
                             "FedDyn's code uses 10); training only, not a DP clip",
    "server.optimizer": "server optimizer applied to the aggregate (FedOpt): sgd (with server.momentum) | adam",
    "server.learning_rate": "server learning rate eta_g (1.0 with sgd = plain FedAvg)",
    "server.momentum": "server momentum",
    "server.lr_decay": "server learning rate x lr_decay**t in round t",
    "compression.enabled": "compressed-sensing uploads (CUAG-PFL Alg. 2-3), composable with any algorithm and DP",
    "compression.kind": "measurement operator: block (Alg. 3, O(I)) | gaussian | bernoulli",
    "compression.rates": "'dynamic' (Alg. 2, layer-wise) or a fixed rate such as '0.5'",
    "compression.r_min": "Alg. 2: the least measurement rate",
    "compression.r_max": "Alg. 2: the largest measurement rate",
    "compression.method": "server reconstruction: min_norm | ista_dct",
    "compression.seed": "seed of the measurement matrices (shared by clients and server)",
    "compression.materialize_gb": "gaussian/bernoulli: hold the round's matrices in memory up to this many GB (float32; "
                                  "one generation a round instead of one a product); 0 = regenerate tile by tile",
    "compression.refresh": "fixed: the same measurement matrices every round (Alg. 3 as written: the model moves only "
                           "in their fixed row space) | round: each layer's entries permuted per round from the shared "
                           "seed (not in seed 004; same traffic)",
    "compression.signs": "none: Alg. 3 as written (its block rows sum to all-ones, so each layer's mean shift is kept "
                         "whole: measured to collapse CIFAR-100) | random: a shared +-1 per entry before measuring, "
                         "so every direction is kept alike (not in seed 004; same cost and traffic)",
    "compression.error_feedback": "keep each client's residual x - Rec(Phi x) and add it to its next upload (error "
                                  "feedback, Karimireddy et al. 2019; not in seed 004; needs refresh='round'; with partial "
                                  "participation the residuals go stale (Li & Li 2023): it lowered seed 004's accuracy)",
    "server_data.fraction": "server-held set (FedMeta's D_meta, FedShare's shared set): fraction of training examples",
    "server_data.overlap": "< 0: drawn IID from the clients (no formal DP); 0-1: writer overlap on natural partitions "
                           "(0 keeps the guarantee)",
    "server_data.num_writers": "writers drawn for the server-held set on natural partitions",
    "sampling.method": "uniform (exactly m clients, replace-one) | poisson (each client with probability q, add/remove-one)",
    "sampling.cohort_size": "uniform sampling: clients per round m",
    "sampling.rate": "poisson sampling: probability q that a client takes part in a round",
    "privacy.secure_rng": "True: DP noise, sampling and shuffles from OS entropy, never written (not reproducible)",
    "engine.strategy": "how clients run: auto | vmap | chunked | sequential | loop (same numbers, different speed)",
    "engine.chunk_size": "chunked strategy: clients per vmapped chunk",
    "engine.unroll": "local-training scan unroll: auto | full | an integer",
    "engine.conv_impl": "convolutions: auto | xla | im2col | space_to_depth (a thin first layer on 2x2 blocks, XLA elsewhere; opt-in) | per_layer (each layer by its shape)",
    "engine.num_devices": "spread the cohort over this many devices: loop, clients round-robin; vmap / chunked / "
                          "sequential, a mesh (0 = auto: a CPU device per core for auto's loop, else one)",
    "engine.stream_clients": "send the cohort to the device this many clients at a time, so device memory is "
                             "bounded by the slice, not the cohort (0 = all at once)",
    "engine.max_replicated_gb": "spread over devices only while the copies of the round's shared inputs (model, state, "
                                "held random matrices) on the other devices fit this many GB; else one device (same numbers, slower)",
    "engine.deferred_dense": "on: plain-SGD clients update a large dense kernel once, at the end of local training, "
                             "from the layer's inputs and output gradients (core/deferred_dense.py; equal up to float "
                             "rounding) | auto: on CPU and GPU backends (where it was measured) | off",
    "dp.noise_multiplier": "z: Gaussian noise std on the clipped sum / S",
    "dp.noise_schedule": "piecewise-constant z_t, e.g. '1:1.2,100:1.0' ('' = constant z)",
    "dp.calibrate_epsilon": "> 0: choose z so that `rounds` rounds spend this epsilon at dp.delta; 0: off (dp.noise_multiplier is z)",
    "dp.clip": "fixed | per_layer | adaptive (private quantile, Andrew et al. 2021) | per_layer_adaptive (the same per "
               "layer from S / sqrt(L) each; counts noised by the server, or by each client under local noise) | "
               "median (NOT private, labelled)",
    "dp.clip_norm": "S: per-client clip norm (initial S for adaptive)",
    "dp.target_quantile": "adaptive clipping: the quantile of update norms S tracks",
    "dp.clip_learning_rate": "adaptive clipping: geometric step of S per round",
    "dp.noise_mode": "central (server adds noise to the sum) | local (each client noises its own update)",
    "dp.accountant": "rdp | pld (dp_accounting)",
    "dp.pld_discretization": "PLD value discretisation (pessimistic: epsilon over-reported by about this)",
    "dp.rdp_orders": "RDP order grid, e.g. '1.5,2,4,8,16,32,64' ('' = privacy.accounting.RDP_ORDERS)",
    "dp.delta": "delta at which epsilon is reported",
    "dp.target_epsilon": "Geyer's stop: with dp.max_delta, stop when delta(target_epsilon) would exceed max_delta",
    "dp.max_delta": "Geyer's stop: Q, the largest delta allowed at dp.target_epsilon",
    "dp.max_epsilon": "stop before a round that would take epsilon(dp.delta) above this (0 = no stop)",
    "dp.client_epsilon_budget": "per-client epsilon budget (ledger): a client that would exceed it is no longer sampled",
    "fedmeta.enabled": "FedMeta: meta step(s) on the server-held set D_meta after every aggregation",
    "fedmeta.learning_rate": "FedMeta: eta_meta",
    "fedmeta.steps": "FedMeta: meta steps per round",
    "fedmeta.lr_decay": "FedMeta: eta_meta x lr_decay**t",
    "fedmeta.batch_size": "FedMeta: meta batch size (0 = all of D_meta at once)",
    "fedprox.mu": "FedProx: proximal coefficient mu",
    "uga.remat": "UGA: off | step | sqrt | <k>: rematerialise every step / sqrt(S)-step / k-step segments",
    "uga.first_order": "UGA: stop gradients through inner gradients (first-order UGA)",
    "uga.gradient_reduction": "UGA: mean (Eq. 13 as written) | sum_of_batch_means",
    "uga.eval_batch_size": "UGA: batch of the whole-data gradient evaluation (0 = client.batch_size)",
    "ldp.clip_norm": "local mini-batch DP: C, per example (or per batch)",
    "ldp.per_example": "local mini-batch DP: False clips the batch's mean gradient (sensitivity 2C)",
    "ldp.noise_multiplier": "local mini-batch DP: z_0, the least noise a step gets",
    "ldp.max_noise_multiplier": "local mini-batch DP: z_max; a client that cannot afford a participation at it stops",
    "ldp.adaptive": "local mini-batch DP: the threshold-driven noise schedule (False: fixed noise, same stop rule)",
    "ldp.fixed_noise": "local mini-batch DP, adaptive=False: z0 (every client at z_0) | calibrated (each client's own z "
                       "for its q T expected participations and threshold, kept for the run)",
    "ldp.thresholds": "local mini-batch DP: per-client epsilon thresholds epsilon_n, one value or a comma list",
    "ldp.delta": "local mini-batch DP: delta of the per-client ledgers",
    "ldp.local_steps": "local mini-batch DP: steps S per participation, each a fresh batch of client.batch_size",
    "ldp.alpha": "local mini-batch DP: history weight, w_{t+1} = (1 - alpha) w_t + alpha sum_k a_k w_k",
    "ldp.weighting": "local mini-batch DP: correlation (softmax of cosine to the mean update) | uniform",
    "ldp.temperature": "local mini-batch DP: tau of a_k = softmax(tau cos(Delta_k, mean Delta))",
    "ldp.rdp_orders": "local mini-batch DP: the ledgers' RDP orders ('' = privacy.example_ledger.LEDGER_ORDERS)",
    "ldp.step_sampling": "local mini-batch DP: fixed (B without replacement per step) | poisson (each example w.p. B/n_k)",
    "ldp.accountant": "local mini-batch DP: rdp | pld, the per-client ledger that decides the noise schedule and stops and reports each epsilon",
    "pfldyn.alpha": "PFLDyn: alpha of the dynamic regulariser (CUAG-PFL Eqs. 9-12)",
    "pfldyn.local_steps": "PFLDyn: local steps P, each two fresh batches of client.batch_size",
    "pfldyn.representation": "PFLDyn: r_W for the prototypes: output (the model's last layer) | penultimate (the last "
                             "hidden layer after its ReLU, as the PFLDyn authors' code)",
    "pfldyn.evaluated_model": "PFLDyn: the model personalised from: server (w^{t+1}, Alg. 1) | client_mean (the mean of "
                              "every client's latest local model, as the authors' code reports; pfldyn_proto only)",
    "pfldyn.server_mean": "PFLDyn: cohort (as written) | population (FedDyn's 1/N)",
    "cuag.mode": "CUAG-PFL noise: paper (Alg. 4 as written: NO formal guarantee, labelled) | sound | none",
    "cuag.mu": "CUAG-PFL: the GDP target mu (paper: 0.25, epsilon 0.92 at delta 1e-5 claimed)",
    "cuag.client_mu": "CUAG-PFL: per-client mu, '0.1:4' (evenly spaced, shuffled) or 'a,b,c' ('' = cuag.mu for all)",
    "cuag.clip_norm": "CUAG-PFL sound mode: C per measured layer",
    "cuag.participations": "CUAG-PFL sound mode: participations each client's mu covers (0 = ceil(lambda T))",
    "cuag.noise_multiplier": "CUAG-PFL sound mode: > 0 fixes z instead of calibrating it (epsilon accounted)",
    "cuag.sound_noise": "CUAG-PFL sound mode calibrated to mu: constant z | sigma_t (z_t proportional to Alg. 4's sigma_t)",
    "cuag.sigma": "CUAG-PFL: Alg. 4's noise 2 C_l sigma / B with sigma fixed (a number) or 'schedule' (sigma_t); "
                  "C_l the own norm (paper, no guarantee) or cuag.clip_norm (sound, accounted)",
    "cuag.adaptive_clip": "CUAG-PFL sound mode: per-layer adaptive quantile clipping (Andrew et al. 2021) from cuag.clip_norm, "
                          "counts noised locally and accounted",
    "cuag.target_quantile": "CUAG-PFL adaptive_clip: the quantile gamma of each layer's norms to clip at",
    "cuag.clip_learning_rate": "CUAG-PFL adaptive_clip: eta of C_l <- C_l exp(-eta (b_bar - gamma))",
    "cuag.count_noise_std": "CUAG-PFL adaptive_clip: sigma_b of each client's local noise on its per-layer counts "
                            "(costs L / sigma_b^2 of mu^2 a participation)",
    "cuag.delta": "CUAG-PFL: delta at which epsilon is reported",
    "udp.clip_norm": "UDP: C, the fixed clip of each upload",
    "udp.epsilon": "UDP: the fixed budget epsilon the per-round noise z_t = 2 c sqrt(t) / epsilon is calibrated to",
    "udp.delta": "UDP: delta of the calibration and of the reported epsilons",
    "udp.mode": "UDP: paper (Wei et al.'s record-level calibration 2 c sqrt(t) C / (epsilon m): NO formal guarantee) | sound (client-level, z_t = kappa sqrt(t) calibrated to epsilon, enforced per client)",
    "udp.participations": "UDP sound mode: participations each client's budget covers (0 = ceil(lambda T))",
    "prifedsync.clip_norm": "PriFedSync: C, the fixed per-layer clip of each PFLDyn(Proto) upload",
    "prifedsync.sigma": "PriFedSync: fixed sigma of the local noise N(0, (2 C sigma / B)^2) per entry (seed 004: 0.45)",
    "prifedsync.delta": "PriFedSync: delta at which epsilon is reported",
    "dp_scaffold.clip": "DP-SCAFFOLD: median (each step's median gradient norm, as seed 004: NO formal guarantee) | fixed",
    "dp_scaffold.clip_norm": "DP-SCAFFOLD: C per example of clip='fixed'",
    "dp_scaffold.noise_multiplier": "DP-SCAFFOLD: sigma_g, step noise N(0, (sigma_g C)^2 I) (seed 004: 1.0)",
    "dp_scaffold.local_steps": "DP-SCAFFOLD: K local steps, each a fresh batch of client.batch_size",
    "dp_scaffold.epsilon_threshold": "DP-SCAFFOLD: > 0 stops a client before its next participation would pass it (0 = none)",
    "dp_scaffold.delta": "DP-SCAFFOLD: delta of the per-client ledgers",
    "dp_scaffold.accountant": "DP-SCAFFOLD: rdp | pld, the per-client ledgers",
}


def describe_keys(cfg=None) -> str:
    """Every key of ``cfg`` (default: ``default_config()``) with its default and meaning, one per line."""
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
