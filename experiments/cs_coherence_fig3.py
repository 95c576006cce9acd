"""Seed 004, Fig. 3: coherence v(Phi, Psi) (Eq. 14) of the three measurement matrices (deterministic
binary block matrix of Alg. 3, Gaussian, Bernoulli) against the DCT and DFT bases, a = 512, rates
0.1 to 0.9. Writes ``coherence.json`` and ``coherence.png`` under ``--out``.

    python experiments/cs_coherence_fig3.py --out results/cs_coherence
"""

from __future__ import annotations

import argparse
import json
import os


from fedjax_dp.compression.coherence import BASES, basis, coherence
from fedjax_dp.compression.operators import make_operator
from fedjax_dp.training.results import dumps as strict_json
from provenance import stamped

MATRICES = ("block", "gaussian", "bernoulli")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument(
        "--rates", type=float, nargs="+", default=[round(0.1 * k, 1) for k in range(1, 10)]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/cs_coherence")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bases = {name: basis(name, args.size) for name in BASES}
    rows = []
    for kind in MATRICES:
        for rate in args.rates:
            phi = make_operator(kind, args.size, rate, seed=args.seed).dense()
            row = {
                "matrix": kind,
                "rate": rate,
                **{b: coherence(phi, psi) for b, psi in bases.items()},
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, "coherence.json"), "w") as f:
        record = stamped({"size": args.size, "seed": args.seed, "rows": rows})
        f.write(strict_json(record, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, b in zip(axes, BASES):
        for kind in MATRICES:
            pts = [(r["rate"], r[b]) for r in rows if r["matrix"] == kind]
            ax.plot(*zip(*pts), marker="o", label=kind)
        ax.set_title(f"{b.upper()} basis, a = {args.size}")
        ax.set_xlabel("compression rate r")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("coherence v(phi, psi)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "coherence.png"), dpi=120)
    print("| matrix | " + " | ".join(f"r={r:g}" for r in args.rates) + " |")
    for kind in MATRICES:
        for b in BASES:
            print(
                f"| {kind}/{b} | "
                + " | ".join(f"{r[b]:.2f}" for r in rows if r["matrix"] == kind)
                + " |"
            )


if __name__ == "__main__":
    main()
