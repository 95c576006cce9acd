"""Workload W in PyTorch on whatever device torch sees (CUDA if present): the peers' two
formulations, run on the GPU for the side-by-side of ``gpu_side_by_side.py``.

The peer harness (``../shared/bench/peers/bench_torch.py``) is CPU-only; this runner takes its
models (``models_torch.py`` from ``--peers``) and the shared workload definition
(``workload_w_data``) and runs:

* ``--impl loop``: one ``nn.Module``, the global weights copied in, 6 ``torch.optim.SGD`` steps per
  client, the flat delta clipped and accumulated on the device (no host synchronisation per client);
* ``--impl vmap``: ``torch.func.vmap(grad(functional_call))`` over chunks of ``--chunk`` clients
  with per-client weights, 6 SGD steps, clip, sum.

TF32 matmuls and convolutions are allowed (``--tf32``, the default), as XLA allows them for float32
on this GPU generation, so both frameworks use the same arithmetic. Prints one ``RESULT {json}``
line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from workload_w_data import (
    BATCH,
    CLIP,
    FLOPS_PER_CLIENT_UPDATE,
    LR,
    SIGMA,
    STEPS,
    cohort_ids,
    make_population,
)  # noqa: E402


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--peers", required=True, help="folder holding the peer harness's models_torch.py"
    )
    parser.add_argument("--model", choices=["cnn", "mlp"], required=True)
    parser.add_argument("--cohort", type=int, required=True)
    parser.add_argument("--impl", choices=["loop", "vmap"], required=True)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-tf32", dest="tf32", action="store_false")
    args = parser.parse_args()

    sys.path.insert(0, args.peers)
    import models_torch as MT
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, grad, vmap
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    population = max(args.cohort, 1000)
    x_all, y_all = make_population(population=population)
    x_all = MT.to_torch_layout(x_all)
    model = MT.make_model(args.model).to(device)
    gvec = parameters_to_vector(model.parameters()).detach().clone()
    gen = torch.Generator(device=device).manual_seed(1)
    cohort = args.cohort

    def cohort_data(r):
        ids = cohort_ids(r, cohort, population)
        x = torch.from_numpy(np.ascontiguousarray(x_all[ids])).to(device, non_blocking=True)
        y = torch.from_numpy(y_all[ids].astype(np.int64)).to(device, non_blocking=True)
        return x, y

    def server_apply(gvec, acc):
        noise = torch.randn(acc.shape, generator=gen, device=device) * (SIGMA * CLIP)
        return gvec + (acc + noise) / cohort

    def clip_scale(norms):
        return torch.clamp(CLIP / norms.clamp_min(1e-12), max=1.0)

    if args.impl == "loop":
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        params = list(model.parameters())

        def run_round(gvec, r):
            x, y = cohort_data(r)
            acc = torch.zeros_like(gvec)
            for c in range(cohort):
                # a copy: vector_to_parameters makes the parameters views of its input
                with torch.no_grad():
                    vector_to_parameters(gvec.clone(), params)
                for s in range(STEPS):
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(
                        model(x[c, s * BATCH : (s + 1) * BATCH]), y[c, s * BATCH : (s + 1) * BATCH]
                    ).backward()
                    opt.step()
                with torch.no_grad():
                    d = parameters_to_vector(params) - gvec
                    acc.add_(d * clip_scale(d.norm()))
            with torch.no_grad():
                return server_apply(gvec, acc)

    else:
        names = [n for n, _ in model.named_parameters()]
        shapes = [p.shape for _, p in model.named_parameters()]
        sizes = [p.numel() for _, p in model.named_parameters()]
        offsets = np.cumsum([0] + sizes[:-1])
        vgrad = vmap(grad(lambda p, x, y: F.cross_entropy(functional_call(model, p, (x,)), y)))

        def run_round(gvec, r):
            x, y = cohort_data(r)
            acc = torch.zeros_like(gvec)
            with torch.no_grad():
                for c0 in range(0, cohort, args.chunk):
                    xc, yc = x[c0 : c0 + args.chunk], y[c0 : c0 + args.chunk]
                    k = xc.shape[0]
                    flat = gvec.unsqueeze(0).repeat(k, 1)
                    per_client = {
                        n: flat[:, int(i) : int(i) + sz].view((k,) + tuple(s))
                        for n, s, sz, i in zip(names, shapes, sizes, offsets)
                    }
                    for s in range(STEPS):
                        g = vgrad(
                            per_client,
                            xc[:, s * BATCH : (s + 1) * BATCH],
                            yc[:, s * BATCH : (s + 1) * BATCH],
                        )
                        for n in names:
                            per_client[n].sub_(g[n], alpha=LR)
                    d = flat - gvec
                    acc.add_(clip_scale(d.norm(dim=1)) @ d)
                return server_apply(gvec, acc)

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, first = [], None
    for r in range(1 + args.warmup + args.rounds):
        start = time.perf_counter()
        gvec = run_round(gvec, r)
        synchronize()
        elapsed = time.perf_counter() - start
        if r == 0:
            first = elapsed
        elif r > args.warmup:
            times.append(elapsed)
    median = statistics.median(times)
    ups = cohort / median
    row = {
        "framework": "torch",
        "model": args.model,
        "cohort": cohort,
        "impl": args.impl,
        "chunk": args.chunk if args.impl == "vmap" else None,
        "tf32": args.tf32,
        "round_times_s": [round(t, 4) for t in times],
        "median_round_s": median,
        "first_round_s": first,
        "client_updates_per_s": ups,
        "achieved_gflops": ups * FLOPS_PER_CLIENT_UPDATE[args.model] / 1e9,
        "finite": bool(torch.isfinite(gvec).all()),
        "torch": torch.__version__,
        "device": str(device),
        "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "device_peak_mib": (
            torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
        ),
    }
    print("RESULT " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
