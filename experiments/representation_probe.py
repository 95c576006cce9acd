"""What each round did to a run's representation: dead ReLU units, the spread of the features, and
how far each layer moved. The measurement behind "why does compression alone collapse CIFAR-100"
(experiments/RESULTS.md, seed 004, the CIFAR-100 compression-only section).

Reads one or more run folders written with ``--config.checkpoint_every=1
--config.checkpoint_keep=0`` (every round's checkpoint kept), rebuilds w_0 from the run's seed, and
for w_0, w_1, ... reports per layer:

* ``dead``: the fraction of the layer's units (conv channels, dense units) whose pre-activation is
  <= 0 on every sampled example (and every position): a ReLU unit that passes no gradient any more;
* ``active``: the fraction of all pre-activations > 0;
* ``moved``: ||w_t - w_{t-1}|| of the layer's kernel and bias together (and, for the whole model,
  the cosine of w_t - w_{t-1} with the first checkpoint's move: near 1 when the server keeps
  re-applying that step, as PFLDyn's state does while the uploads are small: w_t - w_{t-1} = mean
  Delta_t + sum_{s <= t} mean Delta_s with the cohort mean);
* for the output (the representation r_W that PFLDyn(Proto) builds its prototypes on, seed 004 Eq.
  7-8): ``feature_spread``, the standard deviation of r_W(x) across the sampled examples (mean over
  dimensions), and ``same_client_spread``, the mean over clients of that spread within a client's
  own examples (0 = each client's prototypes all equal: the prototype loss is then exactly
  ln(classes)).

Also the norms of the server state (PFLDyn's h) and of the clients' g_n where the checkpoint holds
them.

``--round-one`` (PFLDyn(Proto) / CUAG-PFL runs) takes round 1 apart: every round-1 client starts
from w_0 with g_n = 0, so after it g_n = -alpha (w_n - w_0) (seed 004 Eq. 12) and its local model is
w_0 - g_n / alpha. It reports the readings of each client's local model, of w_0 + mean Delta
(FedAvg's average) and of w_0 + 2 mean Delta (PFLDyn's first server step with the cohort mean: h_1 =
-alpha mean Delta, so w_1 = w_0 + mean Delta - h_1 / alpha), the mean pairwise cosine of the
clients' updates and how many classes each pair of them shares; and the readings along the server's
first move, w_0 + k (w_1 - w_0) for k in ``LINE_MULTIPLES``: where the model goes if the server
keeps re-applying that step (as PFLDyn's state does while the uploads are small).

    python experiments/representation_probe.py results/c100_collapse_probe/compressed \\
        results/c100_collapse_probe/uncompressed --out results/c100_collapse_probe/probe.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.flatten_util import ravel_pytree
from ml_collections import ConfigDict

from fedjax_dp.core import rng as rng_lib
from fedjax_dp.core import tree
from fedjax_dp.data.builders import build_dataset
from fedjax_dp.models import get_model
from fedjax_dp.training.results import write_json
from provenance import stamped


def sampled_examples(dataset, per_client: int, seed: int):
    """``per_client`` training examples of every client (fewer where it has fewer) and their client
    ids."""
    rng = np.random.default_rng(seed)
    index, owner = [], []
    for client, rows in enumerate(dataset.client_train):
        chosen = rng.choice(rows, min(per_client, len(rows)), replace=False)
        index.extend(chosen)
        owner.extend([client] * len(chosen))
    return np.asarray(dataset.x[np.asarray(index)]), np.asarray(owner)


def layer_readings(model, params, x, owner) -> dict:
    """Per layer (flax module name): ``dead`` and ``active`` of its pre-activations; for the output
    layer the spread of r_W(x) across all examples and within each client's."""
    _, captured = model.module.apply(
        {"params": params}, jnp.asarray(x), capture_intermediates=True, mutable=["intermediates"]
    )
    outputs = {
        name: np.asarray(value["__call__"][0])
        for name, value in captured["intermediates"].items()
        if name != "__call__"
    }
    names = list(outputs)  # in call order: the output layer last
    readings = {}
    for name in names[:-1]:  # every layer but the output is followed by a ReLU
        pre = outputs[name].reshape(-1, outputs[name].shape[-1])  # (examples x positions, units)
        readings[name] = {
            "dead": float(np.mean(np.all(pre <= 0, axis=0))),
            "active": float(np.mean(pre > 0)),
        }
    features = outputs[names[-1]]
    within = [features[owner == c].std(axis=0).mean() for c in np.unique(owner)]
    readings[names[-1]] = {
        "feature_spread": float(features.std(axis=0).mean()),
        "same_client_spread": float(np.mean(within)),
    }
    return readings


def norms_by_layer(params) -> dict:
    return {name: float(tree.l2_norm(layer)) for name, layer in params.items()}


def run_context(workdir: str, per_client: int):
    """``(config, dataset, model, probe images, their owners, w_0)`` of a run folder (w_0 rebuilt
    from its seed)."""
    cfg = json.load(open(os.path.join(workdir, "config.json")))
    dataset = build_dataset(ConfigDict(cfg["data"]), cfg["seed"])
    model = get_model(cfg["model"]["name"], dataset.example_shape, dataset.num_classes)
    x, owner = sampled_examples(dataset, per_client, cfg["seed"])
    return (
        cfg,
        dataset,
        model,
        x,
        owner,
        model.init(rng_lib.run_streams(cfg["seed"], False).model_init),
    )


def probe_run(workdir: str, per_client: int) -> list[dict]:
    _, _, model, x, owner, initial = run_context(workdir, per_client)
    checkpoints = sorted(glob.glob(os.path.join(workdir, "checkpoints", "round_*")))
    states = [(0, {"params": initial}, None)]
    for path in checkpoints:
        saved = ocp.StandardCheckpointer().restore(os.path.join(os.path.abspath(path), "state"))
        states.append((int(path.rsplit("_", 1)[1]), saved["state"], saved.get("client_states")))
    rows, previous, first_move = [], None, None
    for round_index, state, client_states in states:
        params = jax.tree_util.tree_map(jnp.asarray, state["params"])
        row = {"round": round_index, "layers": layer_readings(model, params, x, owner)}
        if previous is not None:
            move = jax.tree_util.tree_map(np.subtract, params, previous)
            for name, value in norms_by_layer(move).items():
                row["layers"][name]["moved"] = value
            flat = np.asarray(ravel_pytree(move)[0])
            first_move = flat if first_move is None else first_move
            row["cosine_to_first_move"] = float(
                flat @ first_move / np.linalg.norm(flat) / np.linalg.norm(first_move)
            )
        if state.get("extra"):
            row["server_state_norm"] = norms_by_layer(state["extra"])
        if client_states is not None:
            per_client = np.sqrt(
                sum(
                    np.sum(np.square(np.asarray(v, np.float64)).reshape(len(v), -1), axis=1)
                    for v in jax.tree_util.tree_leaves(client_states)
                )
            )
            row["client_state_norm_mean"] = (
                float(per_client[per_client > 0].mean()) if (per_client > 0).any() else 0.0
            )
        rows.append(row)
        previous = params
    return rows


LINE_MULTIPLES = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)


def round_one_checkpoint(workdir: str, alpha: float) -> tuple[list, list, dict]:
    """From the round-1 checkpoint: the clients' ids, their updates Delta_n = -g_n / alpha (each
    started at w_0 with g_n = 0, Eq. 12) and the server's w_1."""
    path = os.path.abspath(os.path.join(workdir, "checkpoints", "round_000001"))
    saved = ocp.StandardCheckpointer().restore(os.path.join(path, "state"))
    ids = json.load(open(os.path.join(path, "loop", "metadata")))["client_state_ids"]
    g = saved["client_states"]
    deltas = [
        jax.tree_util.tree_map(lambda v, k=k: -np.asarray(v[k], np.float32) / alpha, g)
        for k in range(len(ids))
    ]
    return ids, deltas, saved["state"]["params"]


def mean_of(trees: list):
    return jax.tree_util.tree_map(lambda *v: sum(v) / len(v), *trees)


def round_one(workdir: str, per_client: int) -> dict:
    """Round 1 taken apart (see the module docstring); needs the round-1 checkpoint with the
    clients' g_n."""
    cfg, dataset, model, x, owner, initial = run_context(workdir, per_client)
    alpha = cfg["pfldyn"]["alpha"]
    ids, deltas, w1 = round_one_checkpoint(workdir, alpha)
    mean = mean_of(deltas)
    first_move = jax.tree_util.tree_map(lambda a, b: np.asarray(a) - np.asarray(b), w1, initial)
    moved = lambda delta, scale=1.0: jax.tree_util.tree_map(
        lambda w, d: jnp.asarray(w + scale * d), initial, delta
    )  # noqa: E731
    flat = np.stack([np.asarray(ravel_pytree(d)[0]) for d in deltas])
    unit = flat / np.linalg.norm(flat, axis=1, keepdims=True)
    off_diagonal = ~np.eye(len(ids), dtype=bool)
    classes = dataset.metadata.get("client_classes")
    shared = (
        [len(set(classes[a]) & set(classes[b])) for i, a in enumerate(ids) for b in ids[i + 1 :]]
        if classes
        else []
    )
    return {
        "clients": ids,
        "alpha": alpha,
        "update_norms": np.linalg.norm(flat, axis=1).tolist(),
        "mean_update_norm": float(np.linalg.norm(flat.mean(axis=0))),
        "mean_pairwise_cosine": float((unit @ unit.T)[off_diagonal].mean()),
        "classes_shared_per_pair": float(np.mean(shared)) if shared else None,
        "initial": layer_readings(model, initial, x, owner),
        "local_models": [layer_readings(model, moved(d), x, owner) for d in deltas],
        "w0_plus_mean": layer_readings(model, moved(mean), x, owner),
        "w0_plus_twice_mean": layer_readings(model, moved(mean, 2.0), x, owner),
        "checkpoint_w1": layer_readings(model, jax.tree_util.tree_map(jnp.asarray, w1), x, owner),
        "along_the_first_move": {
            k: layer_readings(model, moved(first_move, k), x, owner) for k in LINE_MULTIPLES
        },
    }


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("workdirs", nargs="+", help="run folders with every round's checkpoint")
    p.add_argument(
        "--per-client", type=int, default=30, help="training examples sampled from each client"
    )
    p.add_argument("--out", default="", help="JSON file for every reading")
    p.add_argument(
        "--round-one",
        action="store_true",
        help="also take round 1 apart (PFLDyn(Proto) / CUAG-PFL runs)",
    )
    args = p.parse_args(argv)
    report = {}
    for workdir in args.workdirs:
        if args.round_one:
            one = report[workdir + ":round_one"] = round_one(workdir, args.per_client)
            spread = lambda r: list(r.values())[-1]["feature_spread"]  # noqa: E731  (the output layer is last)
            print(
                f"{workdir} round 1: mean pairwise cosine {one['mean_pairwise_cosine']:.2f},"
                f" classes shared per pair {one['classes_shared_per_pair']}, feature spread: w_0"
                f" {spread(one['initial']):.3g}, local models"
                f" {np.round([spread(r) for r in one['local_models']], 3).tolist()}, w_0 + mean"
                f" {spread(one['w0_plus_mean']):.3g}, w_0 + 2 mean"
                f" {spread(one['w0_plus_twice_mean']):.3g}, w_1 {spread(one['checkpoint_w1']):.3g};"
                " along w_0 + k (w_1 - w_0): "
                + ", ".join(
                    f"k={k} {spread(r):.3g}" for k, r in one["along_the_first_move"].items()
                )
            )
        report[workdir] = probe_run(workdir, args.per_client)
        print(workdir)
        for row in report[workdir]:
            cells = []
            for name, reading in row["layers"].items():
                cells.append(name + " " + " ".join(f"{k} {v:.3g}" for k, v in reading.items()))
            drift = (
                f" | cosine to the first move {row['cosine_to_first_move']:.3f}"
                if "cosine_to_first_move" in row
                else ""
            )
            print(f"  round {row['round']:3d}: " + " | ".join(cells) + drift)
    if args.out:
        write_json(args.out, stamped(report))


if __name__ == "__main__":
    main()
