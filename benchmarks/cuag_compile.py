"""What compiling costs a CUAG-PFL run (issue 17, performance): ``--rounds`` rounds of the seed-004
setting (``configs/cuag_pfl_cifar10``, CIFAR-10 ACID-3, Alg. 2 dynamic rates unless ``--rates``),
timed whole, with XLA's backend compile time and count summed from ``jax.monitoring``. Alg. 2 picks
a new rate vector most rounds; the block operator pads its measurements to r_max so that the round
compiles once (``compression.pytree.PaddedBlockCompressor``): compare ``--rates dynamic`` with
``--rates 0.5`` (one vector by construction) in one session. Needs ``../shared/data/cifar10`` (or
``--data-dir``); JSON out.

    python benchmarks/cuag_compile.py --rounds 6 --out benchmarks/out/cuag_compile.json
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))

from jax import monitoring  # noqa: E402

from fedjax_dp.configs import cuag_pfl_cifar10  # noqa: E402
from fedjax_dp.training.loop import run_experiment  # noqa: E402
from fedjax_dp.training.results import dumps as strict_json, read_metrics  # noqa: E402

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--rates", nargs="+", default=["dynamic", "0.5"])
    p.add_argument(
        "--data-dir", default=os.path.join(os.path.dirname(HERE), "..", "shared", "data", "cifar10")
    )
    p.add_argument("--out", default="")
    args = p.parse_args()
    seconds, counts = collections.Counter(), collections.Counter()
    monitoring.register_event_duration_secs_listener(
        lambda event, duration, **_: (seconds.update({event: duration}), counts.update({event: 1}))
    )
    result = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "runs": [],
    }
    for rates in args.rates:
        c = cuag_pfl_cifar10.get_config()
        c.rounds, c.eval_every, c.data.data_dir, c.compression.rates = (
            args.rounds,
            args.rounds,
            args.data_dir,
            rates,
        )
        before_s, before_n = seconds[COMPILE_EVENT], counts[COMPILE_EVENT]
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as workdir:
            run_experiment(c, workdir, progress=False, overwrite=True)
            vectors = {
                tuple(r["compression_rates"])
                for r in read_metrics(workdir)
                if r.get("compression_rates")
            }
        result["runs"].append(
            {
                "rates": rates,
                "total_s": time.perf_counter() - start,
                "compile_s": seconds[COMPILE_EVENT] - before_s,
                "compiles": counts[COMPILE_EVENT] - before_n,
                "distinct_rate_vectors": len(vectors),
            }
        )
        print(result["runs"][-1], flush=True)
    text = strict_json(result, indent=2)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
