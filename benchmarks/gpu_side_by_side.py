"""Workload W on a GPU: fedjax_dp and PyTorch (per-client loop and torch.func vmap) side by side in
one run, at cohorts of 100, 1000 and 10000 (issue 20, targets 2 and 3).

Every case runs in its own process (own compilation, own peak device memory), fedjax_dp cases
through ``cohort_throughput.py --worker`` and PyTorch ones through ``torch_workload_w.py``. Matmul
peaks (XLA float32 at default precision, which is TF32 on this GPU generation, float32 at 'highest',
and bfloat16) are measured in the same run, so '% of peak' is a ratio taken under the same
conditions. Rows are appended to ``--out``.jsonl as they finish (a run cut short keeps what it
measured); the summary JSON and a table come last.

    python benchmarks/gpu_side_by_side.py --peers ../shared/bench/peers --out
    benchmarks/out/gpu.json python benchmarks/gpu_side_by_side.py --peers P --only
    jax:cnn:1000:chunked:256:1:xla torch:cnn:1000:vmap:256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from fedjax_dp.training.results import dumps as strict_json

HERE = os.path.dirname(os.path.abspath(__file__))

# jax:<cohort_throughput case>  |  torch:model:cohort:impl[:chunk]
CASES = [
    "torch:cnn:100:loop",
    "jax:cnn:100:chunked:100:1:xla",
    "torch:cnn:100:vmap:100",
    "jax:cnn:100:loop:-:1:xla",
    "torch:cnn:1000:loop",
    "jax:cnn:1000:chunked:256:1:xla",
    "torch:cnn:1000:vmap:256",
    "jax:cnn:1000:chunked:1000:1:xla",
    "jax:cnn:1000:chunked:256:1:im2col",
    "jax:cnn:1000:chunked:256:1:xla:bf16",
    "jax:cnn:10000:chunked:256:1:xla",
    "jax:cnn:10000:chunked:1000:1:xla",
    "torch:cnn:10000:vmap:256",
    "torch:mlp:1000:loop",
    "jax:mlp:1000:chunked:250:1:xla",
    "torch:mlp:1000:vmap:1000",
    "jax:mlp:10000:chunked:1000:1:xla",
    "torch:mlp:10000:vmap:1000",
]


def peaks(n: int = 8192) -> dict:
    """TFLOP/s of an n^3 matmul: XLA float32 (default precision), float32 'highest', bfloat16."""
    import jax
    import jax.numpy as jnp

    out = {}
    for name, dtype, precision in (
        ("xla_f32_default", jnp.float32, None),
        ("xla_f32_highest", jnp.float32, "highest"),
        ("xla_bf16", jnp.bfloat16, None),
    ):
        a = jax.random.normal(jax.random.key(0), (n, n), dtype)
        b = jax.random.normal(jax.random.key(1), (n, n), dtype)
        dot = jax.jit(
            lambda a, b: jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)
        )
        dot(a, b).block_until_ready()
        best = float("inf")
        for _ in range(10):
            start = time.perf_counter()
            dot(a, b).block_until_ready()
            best = min(best, time.perf_counter() - start)
        out[name] = 2 * n**3 / best / 1e12
    return out


def command(case: str, peers: str, rounds: int) -> list[str]:
    framework, rest = case.split(":", 1)
    if framework == "jax":
        from cohort_throughput import parse_case

        return [
            sys.executable,
            os.path.join(HERE, "cohort_throughput.py"),
            "--worker",
            json.dumps(parse_case(rest)),
            "--rounds",
            str(rounds),
        ]
    model, cohort, impl, *chunk = rest.split(":")
    return [
        sys.executable,
        os.path.join(HERE, "torch_workload_w.py"),
        "--peers",
        peers,
        "--model",
        model,
        "--cohort",
        cohort,
        "--impl",
        impl,
        "--rounds",
        str(rounds if impl == "vmap" or int(cohort) <= 100 else 2),
        *(["--chunk", chunk[0]] if chunk else []),
    ]


def run_case(case: str, peers: str, rounds: int, timeout: int) -> dict:
    try:
        out = subprocess.run(
            command(case, peers, rounds), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"case": case, "error": f"timed out after {timeout} s"}
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    if not line:
        return {"case": case, "error": out.stderr[-2000:]}
    return {"case": case, **json.loads(line[0][7:])}


def main():
    sys.path.insert(0, HERE)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--peers", required=True, help="folder holding the peer harness's models_torch.py"
    )
    parser.add_argument("--only", nargs="*", default=CASES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=240, help="seconds per case")
    parser.add_argument(
        "--budget",
        type=float,
        default=0,
        help="seconds for the whole run (0: none): a case gets what is left, up to --timeout, and"
        " none is started with under 30 s left (recorded as not started)",
    )
    parser.add_argument("--peak-size", type=int, default=8192, help="matmul size for the peaks")
    parser.add_argument("--out", default=os.path.join(HERE, "out", "gpu_side_by_side.json"))
    args = parser.parse_args()
    start = time.monotonic()  # --budget counts from here
    # workers share the device one at a time
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    peak = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                f"import sys, json; sys.path.insert(0, {HERE!r}); from gpu_side_by_side import"
                f" peaks; print('RESULT ' + json.dumps(peaks({args.peak_size})))"
            ),
        ],
        capture_output=True,
        text=True,
    )
    matmul = json.loads([l for l in peak.stdout.splitlines() if l.startswith("RESULT ")][0][7:])
    print(
        "matmul peaks (TFLOP/s):",
        json.dumps({k: round(v, 1) for k, v in matmul.items()}),
        flush=True,
    )
    rows = []
    with open(args.out + "l", "w") as log:
        for case in args.only:
            left = args.budget - (time.monotonic() - start) if args.budget else args.timeout
            if left < 30:
                row = {"case": case, "error": f"not started: {left:.0f} s of --budget left"}
            else:
                row = run_case(case, args.peers, args.rounds, int(min(args.timeout, left - 10)))
            if "achieved_gflops" in row:
                reference = matmul[
                    "xla_bf16" if row.get("compute_dtype") == "bfloat16" else "xla_f32_default"
                ]
                row["percent_of_matmul_peak"] = 100 * row["achieved_gflops"] / 1e3 / reference
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            if "error" in row:
                print(
                    f"{case:40s} FAILED"
                    f" {row['error'].strip().splitlines()[-1] if row['error'].strip() else ''}",
                    flush=True,
                )
            else:
                print(
                    f"{case:40s} {row['client_updates_per_s']:10.1f} updates/s"
                    f" {row['percent_of_matmul_peak']:5.1f} % round"
                    f" {row['median_round_s'] * 1e3:8.1f} ms  device peak"
                    f" {row['device_peak_mib'] or 0:8.0f} MiB  program"
                    f" {row.get('program_memory_mib')}",
                    flush=True,
                )
    with open(args.out, "w") as f:
        f.write(
            strict_json(
                {
                    "benchmark": "workload W on GPU, side by side",
                    "matmul_peak_tflops": matmul,
                    "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "rows": rows,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
