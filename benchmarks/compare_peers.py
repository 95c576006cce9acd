"""Side-by-side run of fedjax_dp (``auto``) and the peer harness on workload W, interleaved in one
session so that ratios are taken under the same machine conditions.

The peer harness lives in ``../shared/bench/peers`` (read-only there: copy it and run its
``setup_peers.sh`` to build the venvs). Example:

    cp -r ../shared/bench/peers /tmp/peers && (cd /tmp/peers && ./setup_peers.sh)
    python benchmarks/compare_peers.py --peers /tmp/peers --out benchmarks/out/compare_peers.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# the repository, so a machine without `pip install -e .` runs it
sys.path.insert(1, os.path.dirname(HERE))

from fedjax_dp.training.results import dumps as strict_json  # noqa: E402

PAIRS = [  # (label, ours, peer script args)
    (
        "cnn C=100",
        "cnn:100:auto",
        [
            ("torch loop", "venv-torch", "bench_torch.py", ["--impl", "loop"]),
            ("pfl-research", "venv-pfl", "bench_pfl.py", []),
        ],
    ),
    (
        "mlp C=1000",
        "mlp:1000:auto",
        [
            (
                "torch.func vmap",
                "venv-torch",
                "bench_torch.py",
                ["--impl", "vmap", "--chunk", "64"],
            ),
            ("torch loop", "venv-torch", "bench_torch.py", ["--impl", "loop"]),
            ("pfl-research", "venv-pfl", "bench_pfl.py", []),
        ],
    ),
]


def run_ours(case: str, rounds: int) -> dict:
    """cohort_throughput.py's row for ``case``, with the float32 matmul peaks (GFLOP/s) it measured
    beside it."""
    path = os.path.join(HERE, "out", "compare_ours_last.json")
    if os.path.exists(path):
        os.remove(path)  # never read a previous run's numbers
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "cohort_throughput.py"),
            "--cases",
            case,
            "--rounds",
            str(rounds),
            "--out",
            path,
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(
            f"cohort_throughput.py --cases {case} failed ({out.returncode}):\n{out.stderr[-2000:]}"
        )
    with open(path) as f:
        report = json.load(f)
    return {**report["rows"][0], "matmul_peak_gflops": report["matmul_peak_gflops"]}


def run_peer(
    peers: str, venv: str, script: str, extra: list, model: str, cohort: int, rounds: int
) -> dict | None:
    python = os.path.join(peers, venv, "bin", "python")
    if not os.path.exists(python):
        return None
    results = os.path.join(HERE, "out", "compare_peer_rows.jsonl")
    if os.path.exists(results):
        os.remove(results)
    subprocess.run(
        [
            python,
            script,
            "--model",
            model,
            "--cohort",
            str(cohort),
            "--rounds",
            str(rounds),
            *extra,
        ],
        cwd=peers,
        env=dict(os.environ, PBENCH_RESULTS=results),
        capture_output=True,
        text=True,
    )
    with open(results) as f:
        return json.loads(f.readlines()[-1])


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--peers", required=True, help="a copy of ../shared/bench/peers with its venvs built"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--workloads",
        nargs="*",
        default=[label for label, _, _ in PAIRS],
        choices=[label for label, _, _ in PAIRS],
    )
    parser.add_argument("--out", default=os.path.join(HERE, "out", "compare_peers.json"))
    args = parser.parse_args()
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    table = []
    for label, ours_case, peers in PAIRS:
        if label not in args.workloads:
            continue
        model, cohort = ours_case.split(":")[0], int(ours_case.split(":")[1])
        ours = run_ours(ours_case, args.rounds)
        row = {"workload": label, "fedjax_dp_auto": ours["client_updates_per_s"], "peers": {}}
        for name, venv, script, extra in peers:
            result = run_peer(args.peers, venv, script, extra, model, cohort, args.rounds)
            if result is not None:
                row["peers"][name] = result["client_updates_per_s"]
        again = run_ours(ours_case, args.rounds)  # before and after the peers: drift shows up here
        row["fedjax_dp_auto_repeat"] = again["client_updates_per_s"]
        row["matmul_peak_gflops"] = {
            lib: max(ours["matmul_peak_gflops"][lib], again["matmul_peak_gflops"][lib])
            # this machine, in the same run
            for lib in ours["matmul_peak_gflops"]
        }
        best_peer = max(row["peers"].values()) if row["peers"] else float("nan")
        row["ratio_to_best_peer"] = (
            min(row["fedjax_dp_auto"], again["client_updates_per_s"]) / best_peer
        )
        table.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        f.write(strict_json({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": table}, indent=2))


if __name__ == "__main__":
    main()
