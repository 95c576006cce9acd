"""The largest values of a workload-W engine program as XLA compiled it, by instruction (issue 20).

On an H100 the program's temporaries grew by about the cohort's input bytes from C = 1000 to 10000
(+1,662 MiB for 1,615 MiB more images; ``benchmarks/RESULTS.md``), while the same program compiled
for a CPU holds no such copy. This writes the compiled HLO (gzipped) and lists the instructions of
the program's own computations (not the bodies of fusions, which own no buffers) whose values are
largest, so a second cohort-sized value is named with its op and the JAX operation it came from.

    python benchmarks/program_hlo.py cnn:1000:auto --out benchmarks/out/hlo_cnn_1000
    python benchmarks/program_hlo.py cnn:1000:auto cnn:10000:auto --out OUT     # one folder per
    case
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, os.path.dirname(HERE))

BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
COMPUTATION = re.compile(r"^(ENTRY\s+)?%(?P<name>[\w.\-]+)\s*\(.*\{\s*$")
INSTRUCTION = re.compile(
    r"^\s*(ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<type>\w+\[[\d,]*\])(\{[^}]*\})?\s+"
    r"(?P<op>[\w\-]+)\((?P<rest>.*)$"
)
FUSION_BODY = re.compile(r"\bfusion\(.*?calls=%(?P<body>[\w.\-]+)")
# ops that name an existing buffer, not a new one
ALIASES = ("parameter", "get-tuple-element", "bitcast", "tuple")
OP_NAME = re.compile(r'op_name="(?P<op_name>[^"]*)"')


def value_bytes(hlo_type: str) -> int:
    """Bytes of an array type such as ``f32[100,28,28,1]`` (unknown element types count 4 bytes)."""
    dtype, dims = hlo_type[:-1].split("[")
    count = 1
    for d in filter(None, dims.split(",")):
        count *= int(d)
    return count * BYTES.get(dtype, 4)


def largest_values(hlo_text: str, top: int = 25) -> list[dict]:
    """The ``top`` largest array values defined in computations that are not fusion bodies, largest
    first: ``{bytes, type, op, name, computation, op_name}`` (tuples are skipped: their elements are
    listed)."""
    lines = hlo_text.splitlines()
    fusion_bodies = {m.group("body") for line in lines for m in [FUSION_BODY.search(line)] if m}
    values, computation = [], None
    for line in lines:
        header = COMPUTATION.match(line)
        if header:
            computation = header.group("name")
            continue
        found = INSTRUCTION.match(line)
        if not found or computation in fusion_bodies:
            continue
        op_name = OP_NAME.search(found.group("rest"))
        values.append(
            {
                "bytes": value_bytes(found.group("type")),
                "type": found.group("type"),
                "op": found.group("op"),
                "name": found.group("name"),
                "computation": computation,
                "op_name": op_name.group("op_name") if op_name else "",
            }
        )
    return sorted(values, key=lambda v: -v["bytes"])[:top]


def cohort_sized(hlo_text: str, cohort: int) -> list[dict]:
    """Values outside fusion bodies whose leading dimension is the cohort, made by ops that allocate
    (not parameters, tuple elements or bitcasts): copies of the cohort's inputs or outputs the
    program makes itself."""
    values = largest_values(hlo_text, top=10**9)
    return [
        v
        for v in values
        if v["op"] not in ALIASES
        and v["type"].split("[")[1].split(",")[0].rstrip("]") == str(cohort)
    ]


def report(case_text: str, out_dir: str, top: int = 25) -> dict:
    """Compiles ``case_text``'s engine program, writes ``hlo.txt.gz`` and ``largest.json`` under
    ``out_dir``."""
    import jax

    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from cohort_throughput import build_workload, parse_case
    from workload_w import memory_bytes

    case = parse_case(case_text)
    work = build_workload(case)
    compiled = work.compiled_program(case["cohort"])
    text = compiled.as_text()
    result = {
        "case": case_text,
        **{k: v for k, v in case.items() if k != "cohort"},
        "cohort": case["cohort"],
        "backend": jax.default_backend(),
        "device": str(jax.local_devices()[0].device_kind),
        "program_memory_mib": {name: b / 2**20 for name, b in memory_bytes(compiled).items()},
        "largest": largest_values(text, top),
        "cohort_sized": cohort_sized(text, case["cohort"]),
    }
    os.makedirs(out_dir, exist_ok=True)
    with gzip.open(os.path.join(out_dir, "hlo.txt.gz"), "wt") as f:
        f.write(text)
    with open(os.path.join(out_dir, "largest.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("cases", nargs="+", help="cohort_throughput cases, e.g. cnn:1000:auto")
    parser.add_argument("--out", default=os.path.join(HERE, "out", "program_hlo"))
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    for text in args.cases:
        folder = (
            os.path.join(args.out, re.sub(r"[^\w.\-]", "_", text))
            if len(args.cases) > 1
            else args.out
        )
        result = report(text, folder, args.top)
        print(
            f"{text}: program memory (MiB)"
            f" {json.dumps({k: round(v, 1) for k, v in result['program_memory_mib'].items()})}"
        )
        for v in (
            result["largest"][:10]
            + [
                {
                    "op": "-- cohort-sized --",
                    "bytes": 0,
                    "type": "",
                    "computation": "",
                    "op_name": "",
                }
            ]
            + result["cohort_sized"][:10]
        ):
            print(
                f"  {v['bytes'] / 2**20:9.1f} MiB  {v['op']:22s} {v['type']:32s} {v['computation']}"
                f"  {v['op_name'][-80:]}"
            )


if __name__ == "__main__":
    main()
