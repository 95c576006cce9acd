"""Where a CUAG-PFL round's time goes (issue 17, performance): one round of the seed-004 setting
(CIFAR-10 ACID-3, 100 clients, 10 a round, P = 25 pairs of B = 50, the ``cnn_pfl`` CNN) timed as
  pack       drawing and gathering the cohort's 25 x 100 examples per client (host),
  pfldyn     the round of PFLDyn(Proto) without upload transforms,
  cuag       the same round with CUAG-PFL's chain (compress, Alg. 4 noise, reconstruct),
  evaluate   the personalised evaluation of all 100 clients (one mapped pass),
  forward    the evaluation model's forward pass alone over every image of the dataset (batches of
             500): the least the evaluation can cost, since every client's prototypes and scores
             need it,
  chain      the chain alone: the CUAG round with local training replaced by a random update of the
             model's shape (``WithoutTraining``), minus the same round with an empty chain,
each the median of ``--repeats`` after one compiling call, all in this one process. The chain's
share of a round is chain / cuag (measured directly: the difference cuag - pfldyn of two ~10 s
rounds is within their run-to-run noise). Needs ``../shared/data/cifar10`` (or ``--data-dir``); JSON
out.

    python benchmarks/cuag_round.py --out benchmarks/out/cuag_round.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_dp.configs import cuag_pfl_cifar10  # noqa: E402
from fedjax_dp.core import rng as rng_lib  # noqa: E402
from fedjax_dp.core.algorithm import ClientOut  # noqa: E402
from fedjax_dp.core.client_states import ClientStateStore  # noqa: E402
from fedjax_dp.core.round import FederatedRound  # noqa: E402
from fedjax_dp.data.builders import build_dataset  # noqa: E402
from fedjax_dp.training.build import build_model_and_round, build_round, spread  # noqa: E402
from fedjax_dp.training.cohorts import make_packer  # noqa: E402
from fedjax_dp.training.personalized_evaluation import PersonalizedEvaluator  # noqa: E402
from fedjax_dp.training.results import write_json  # noqa: E402
from fedjax_dp.core.host_devices import use_a_device_per_core  # noqa: E402

use_a_device_per_core()  # what a run gets (Experiment asks the same), before JAX starts

sys.path.insert(0, HERE)
from timing import timed  # noqa: E402


class WithoutTraining:
    """``algorithm`` with its local training replaced by a random update of the same shapes (scale
    0.01) and the client's state kept: a round of it runs the upload chain and the round's plumbing
    only."""

    def __init__(self, algorithm):
        self._algorithm = algorithm

    def __getattr__(self, name):
        return getattr(self._algorithm, name)

    def client_update(self, shared, client, client_state, key):
        shapes = jax.eval_shape(self._algorithm.client_update, shared, client, client_state, key)
        leaves, treedef = jax.tree_util.tree_flatten(shapes.upload)
        keys = jax.random.split(key, len(leaves))
        upload = treedef.unflatten(
            [0.01 * jax.random.normal(k, s.shape, s.dtype) for k, s in zip(keys, leaves)]
        )
        return ClientOut(
            upload,
            jax.numpy.float32(1.0),
            client_state,
            jax.numpy.float32(0.0),
            jax.numpy.bool_(True),
        )


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data-dir", default="")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--conv-impl",
        default="auto",
        help="engine.conv_impl (an A/B of the convolution formulations)",
    )
    p.add_argument(
        "--skip-chain",
        action="store_true",
        help="time PFLDyn's round, the evaluation and the forward pass only",
    )
    p.add_argument("--out", default="")
    args = p.parse_args()
    cfg = cuag_pfl_cifar10.get_config()
    cfg.engine.conv_impl = args.conv_impl
    if args.data_dir:
        cfg.data.data_dir = args.data_dir
    dataset = build_dataset(cfg.data, cfg.seed)
    # the engine the CLI runs this setting with
    choice, model, _ = build_model_and_round(cfg, dataset)
    params = model.init(jax.random.key(0))
    ids = np.arange(cfg.sampling.cohort_size)
    result = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "backend": jax.default_backend(),
        "engine": vars(choice) if hasattr(choice, "__dict__") else str(choice),
        "parameters": int(sum(x.size for x in jax.tree_util.tree_leaves(params))),
    }
    packer = None
    for name, mode in (("pfldyn", None),) + ((("cuag", "paper"),) if not args.skip_chain else ()):
        c = cfg.copy_and_resolve_references()
        if mode is None:
            c.algorithm, c.compression.enabled = "pfldyn_proto", False
        runner = build_round(c, model, choice, dataset.num_clients, None, dataset.train_sizes())
        packer = packer or make_packer(c, dataset, runner.algorithm.requirements)
        state = runner.init(params)
        store = ClientStateStore(runner.algorithm.client_state_init(params))
        cohort = packer(ids, np.random.default_rng(0), None)
        cohort["client_id"] = ids.astype(np.int32)
        stacked = store.gather(ids)
        uploads = runner.specialized(state)
        key = rng_lib.round_key(jax.random.key(0), 1)
        first, median = timed(
            lambda: runner(state, cohort, key, 1, stacked, uploads, noise_key=key).state.params,
            args.repeats,
        )
        result[name] = {"first_s": first, "median_s": median}
        # the chain alone: the round without training, with and without the chain
        if mode is not None:
            for part, chained in (("chain_off", ()), ("chain_on", runner.uploads)):
                bare = FederatedRound(
                    WithoutTraining(runner.algorithm),
                    chained,
                    choice.strategy,
                    choice.chunk_size,
                    **spread(choice),
                )
                bare_state = bare.init(params)
                bare_uploads = bare.specialized(bare_state)
                first, median = timed(
                    lambda b=bare, s=bare_state, u=bare_uploads: (
                        b(s, cohort, key, 1, stacked, u, noise_key=key).state.params
                    ),
                    args.repeats,
                )
                result[part] = {"first_s": first, "median_s": median}
        if mode is None:
            result["pack"] = {
                "median_s": timed(
                    lambda: packer(ids, np.random.default_rng(1), None)["mask"], args.repeats
                )[1]
            }
            evaluator = PersonalizedEvaluator(dataset)
            first, median = timed(
                lambda: evaluator.per_client_accuracy(runner.algorithm, state, store), args.repeats
            )
            result["evaluate"] = {
                "first_s": first,
                "median_s": median,
                "clients": dataset.num_clients,
            }
            apply = jax.jit(runner.algorithm.evaluation_apply or runner.algorithm.apply)
            images = evaluator.x  # the evaluator's device copy of the dataset
            first, median = timed(
                lambda: [
                    apply(state.params, images[i : i + 500]) for i in range(0, len(images), 500)
                ],
                args.repeats,
            )
            result["forward"] = {"first_s": first, "median_s": median, "images": len(images)}
    if not args.skip_chain:
        result["chain_s"] = result["chain_on"]["median_s"] - result["chain_off"]["median_s"]
        result["chain_share_of_round"] = result["chain_s"] / result["cuag"]["median_s"]
        result["round_difference_share"] = (
            result["cuag"]["median_s"] - result["pfldyn"]["median_s"]
        ) / result["cuag"]["median_s"]
    print(json.dumps(result, indent=2))
    if args.out:
        write_json(args.out, result, indent=2)


if __name__ == "__main__":
    main()
