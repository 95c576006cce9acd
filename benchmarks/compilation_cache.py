"""What the command's persistent compilation cache saves
(``fedjax_dp/training/compilation_cache.py``).

Each case runs the ``fedjax-dp`` command three times, each a fresh process, one after the other:
with the cache off, then cold (an empty cache folder), then warm (the folder the cold run filled).
Wall seconds of each and the warm / cold and off / cold ratios, taken in one run; the final accuracy
of each (it must not change). A case whose data is missing (``../shared/data``) is skipped. JSON
out.

    python benchmarks/compilation_cache.py --out benchmarks/out/compilation_cache.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED_DATA = os.path.join(ROOT, "..", "shared", "data")
CASES = {  # name: (command-line arguments, data folder it needs or None)
    "fedavg_mnist (README's main command)": (["--config", "fedavg_mnist"], None),
    "fedavg_mnist, 20 rounds, --seeds 0,1,2": (
        ["--config", "fedavg_mnist", "--config.rounds=20", "--seeds", "0,1,2"],
        None,
    ),
    "cuag_pfl_cifar10, 2 rounds": (
        ["--config", "cuag_pfl_cifar10", "--config.rounds=2"],
        "cifar10",
    ),
}


def run_command(arguments: list[str], cache: str, workdir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["FEDJAX_DP_COMPILATION_CACHE"] = cache
    command = [
        sys.executable,
        "-m",
        "fedjax_dp",
        *arguments,
        "--noprogress",
        "--overwrite",
        "--workdir",
        workdir,
    ]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{' '.join(arguments)} exited {done.returncode}: {done.stderr[-2000:]}")
    accuracy = re.findall(
        r"final (?:test_|client_|personalized_)?accuracy\s+([0-9.]+)", done.stdout
    )
    return {"seconds": seconds, "final_accuracies": accuracy}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--out", default=os.path.join(HERE, "out", "compilation_cache.json"))
    args = parser.parse_args()
    from xla_cost import write_result

    rows = {}
    for name in args.cases:
        arguments, data = CASES[name]
        if data is not None:
            if not os.path.isdir(os.path.join(SHARED_DATA, data)):
                print(f"{name}: skipped ({data} not in {SHARED_DATA})")
                continue
            arguments = arguments + [f"--config.data.data_dir={os.path.join(SHARED_DATA, data)}"]
        with tempfile.TemporaryDirectory() as scratch:
            folder, workdir = os.path.join(scratch, "xla"), os.path.join(scratch, "run")
            row = {
                "off": run_command(arguments, "off", workdir),
                "cold": run_command(arguments, folder, workdir),
                "warm": run_command(arguments, folder, workdir),
            }
            row["cache_bytes"] = sum(
                os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
            )
        row["warm_over_cold"] = row["warm"]["seconds"] / row["cold"]["seconds"]
        row["cold_over_off"] = row["cold"]["seconds"] / row["off"]["seconds"]
        row["same_accuracies"] = (
            len({json.dumps(row[k]["final_accuracies"]) for k in ("off", "cold", "warm")}) == 1
        )
        rows[name] = row
        print(
            f"{name:42s} off {row['off']['seconds']:6.1f} s  cold {row['cold']['seconds']:6.1f} s "
            f" warm {row['warm']['seconds']:6.1f} s  warm/cold {row['warm_over_cold']:.2f}  same"
            f" accuracies {row['same_accuracies']}  cache {row['cache_bytes'] / 2**20:.1f} MiB",
            flush=True,
        )
    write_result(args.out, {"cases": rows})


if __name__ == "__main__":
    main()
