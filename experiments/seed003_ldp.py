"""Seed 003 (local mini-batch gradient DP, per-client thresholds, history/correlation weighting):
accuracy against the per-client epsilon threshold, and the ablations the patent's two claims need.

Methods, each at per-client epsilon in ``--epsilons`` (delta 1e-5):
  ldp          the method: threshold schedule (adaptive z in [z_0, z_max]), correlation weights,
               alpha
  ldp_fixed    the same with fixed noise (``ldp.adaptive = False, ldp.fixed_noise = 'calibrated'``):
               each client's own z, the least under which the q T participations of S steps expected
               of it spend its epsilon by its own ledger, kept for the run (one z for IID clients of
               equal size; more noise for FEMNIST's smaller writers); same stopping rule
  ldp_mean     the method with uniform weights (a_k = 1/K): no correlation weighting
  ldp_poisson  the method with Poisson step batches (each example w.p. B / n_k) and per-client PLD
               ledgers: the same threshold, accounted as what ran
  dpfedavg     DP-FedAvg, local noise, client-level: z so that q T participations spend epsilon
               (GDP, sensitivity 2S), per-client budget epsilon (a different unit: a whole client)
  fedavg       non-private reference (once)
(``--methods`` picks a subset) and ``--alphas`` / ``--taus`` sweeps of the method at the middle
epsilon. Writes ``rows.json``, a markdown table and ``accuracy_vs_epsilon.png`` under ``--out``.

    python experiments/seed003_ldp.py --data-dir ../shared/data/mnist --out results/seed003
"""

from __future__ import annotations

import argparse
import json
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedjax_dp.privacy.accounting import gdp  # noqa: E402
from fedjax_dp.training.default_config import default_config  # noqa: E402
from fedjax_dp.training.loop import run_experiment  # noqa: E402
from fedjax_dp.training.results import dumps as strict_json  # noqa: E402
from preflight import checked_runs  # noqa: E402
from provenance import provenance  # noqa: E402

DELTA = 1e-5
METHODS = ("fedavg", "ldp", "ldp_fixed", "ldp_mean", "ldp_poisson", "dpfedavg")


def base(args):
    c = default_config()
    c.rounds, c.eval_every, c.seed = args.rounds, max(1, args.rounds // 5), args.seed
    c.model.name = args.model
    c.data.num_clients, c.data.partition = args.clients, args.partition
    if args.data_dir:
        c.data.source, c.data.data_dir = args.source, args.data_dir
    c.data.min_train_per_client = args.min_train
    c.data.invert = args.invert
    c.sampling.cohort_size = args.cohort
    c.client.update(batch_size=args.batch, learning_rate=args.gamma, epochs=1)
    # the held-out validation set (step s6)
    c.server_data.overlap, c.server_data.fraction = 0.0, 0.01
    return c


def ldp(args, eps, **ldp_fields):
    c = base(args)
    c.algorithm = "ldp_minibatch"
    if ldp_fields.get("step_sampling") == "poisson":
        c.privacy.accountant = "pld"  # Poisson steps are accounted by the PLD ledger
    c.privacy.delta = DELTA
    c.ldp.update(
        thresholds=str(eps),
        local_steps=args.steps,
        clip_norm=args.clip,
        noise_multiplier=args.z0,
        max_noise_multiplier=args.zmax,
        alpha=args.alpha,
        temperature=args.tau,
    )
    c.ldp.update(ldp_fields)
    return c


def dp_fedavg(args, eps):
    c = base(args)
    c.algorithm = "dp_fedavg"
    participations = max(1, args.cohort / args.clients * args.rounds)
    c.privacy.update(delta=DELTA, client_epsilon_budget=eps)
    c.dp.update(
        noise_mode="local",
        clip_norm=args.clip,
        noise_multiplier=2 * math.sqrt(participations) / gdp.mu_from_epsilon(eps, DELTA),
    )
    return c


def run(name, cfg, args, extra):
    workdir = os.path.join(args.out, name)
    s = run_experiment(cfg, workdir, overwrite=True, progress=False)
    privacy = json.load(open(os.path.join(workdir, "privacy.json")))
    spread = privacy.get("epsilons", {}).get("per_client", {})
    row = {
        "run": name,
        **extra,
        "accuracy": s.final.get("test_accuracy"),
        "best": s.best_accuracy,
        "validation": s.final.get("validation_accuracy"),
        "epsilon_max": s.epsilon,
        "formal": s.formal,
        "epsilon_quantiles": spread.get("quantiles_of_participants"),
        "rounds": s.rounds,
        "stopped": next((n for n in privacy.get("notes", []) if "clients stopped" in n), None),
        "noise_multipliers": privacy.get("noise_multipliers"),
        "seconds": round(s.seconds, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def plan_runs(args):
    """The (name, config, row fields) of every run the arguments ask for, in the order they run."""
    runs, wanted = [], set(args.methods)
    if "fedavg" in wanted:
        fedavg = base(args)
        fedavg.algorithm = "fedavg"
        runs.append(("fedavg", fedavg, {"method": "fedavg", "epsilon": None}))
    variants = {
        "ldp": {},
        "ldp_fixed": {"adaptive": False, "fixed_noise": "calibrated"},
        "ldp_mean": {"weighting": "uniform"},
        "ldp_poisson": {"step_sampling": "poisson"},
    }
    for eps in args.epsilons:
        if eps <= 0:
            raise ValueError(f"--epsilons: every per-client epsilon must be > 0, got {eps:g}")
        for method in METHODS[1:]:
            if method in wanted:
                cfg = (
                    dp_fedavg(args, eps)
                    if method == "dpfedavg"
                    else ldp(args, eps, **variants[method])
                )
                runs.append((f"{method}-eps{eps:g}", cfg, {"method": method, "epsilon": eps}))
    middle = args.epsilons[len(args.epsilons) // 2]
    for alpha in args.alphas:
        runs.append(
            (
                f"ldp-alpha{alpha:g}",
                ldp(args, middle, alpha=alpha),
                {"method": "ldp", "epsilon": middle, "alpha": alpha},
            )
        )
    for tau in args.taus:
        runs.append(
            (
                f"ldp-tau{tau:g}",
                ldp(args, middle, temperature=tau),
                {"method": "ldp", "epsilon": middle, "tau": tau},
            )
        )
    return runs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--epsilons", type=float, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--alphas", type=float, nargs="*", default=[0.5, 1.0])
    p.add_argument("--taus", type=float, nargs="*", default=[0.0, 5.0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--cohort", type=int, default=10)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--gamma", type=float, default=0.05)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--z0", type=float, default=0.8)
    p.add_argument("--zmax", type=float, default=10.0)
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--tau", type=float, default=1.0)
    p.add_argument("--model", default="cnn_fedavg")
    p.add_argument("--partition", default="iid")
    p.add_argument("--source", default="mnist")
    p.add_argument("--data-dir", default="")
    p.add_argument(
        "--min-train",
        type=int,
        default=0,
        help=(
            "natural partitions: writers with at least this many "
            "training examples (each step draws B of them)"
        ),
    )
    p.add_argument(
        "--invert",
        action="store_true",
        help="femnist: ink high, background 0 (LEAF stores the background high)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--out", default="results/seed003")
    return p


def main():
    p = parser()
    args = p.parse_args()
    runs = checked_runs(p, lambda: plan_runs(args))
    os.makedirs(args.out, exist_ok=True)
    rows, setting = [], provenance()
    for name, cfg, extra in runs:
        rows.append(run(name, cfg, args, extra))
        # after every run: a crash keeps the rows
        with open(os.path.join(args.out, "rows.json"), "w") as f:
            f.write(strict_json({"setting": setting, "args": vars(args), "rows": rows}, indent=2))
    plot(rows, os.path.join(args.out, "accuracy_vs_epsilon.png"))


def plot(rows, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    plot_panel(ax, rows)
    fig.tight_layout()
    fig.savefig(path)


def plot_panel(ax, rows, title=None):
    """Final test accuracy against the per-client epsilon, one line per method (the alpha / tau
    sweeps left out), non-private FedAvg as a dashed line."""
    for method in METHODS[1:]:
        pts = sorted(
            (r["epsilon"], r["accuracy"])
            for r in rows
            if r["method"] == method and "alpha" not in r and "tau" not in r
        )
        if pts:
            ax.plot(*zip(*pts), marker="o", label=method)
    ref = [r["accuracy"] for r in rows if r["method"] == "fedavg"]
    if ref:
        ax.axhline(ref[0], color="k", linestyle="--", label="fedavg (non-private)")
    ax.set(
        xscale="log", xlabel="per-client epsilon (delta 1e-5)", ylabel="test accuracy", title=title
    )
    epsilons = sorted({r["epsilon"] for r in rows if r["epsilon"] is not None})
    ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
    ax.minorticks_off()
    ax.legend(fontsize="small")


if __name__ == "__main__":
    main()
