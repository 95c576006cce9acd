"""PriFedSync (Zheng, Chen, Long, Su 2021, "Federated f-Differential Privacy", AISTATS) as seed 004 runs
it as a CUAG-PFL baseline (§7.2.3 item 4, §7.2.4; ALGORITHMS.md §4): Gaussian DP with a FIXED noise scale
and a FIXED clip on PFLDyn(Proto), so that it contrasts with CUAG-PFL's adaptive noise. Seed 004's
experiments: clip 1, noise 0.45, no compression; it reports epsilon in [0.41, 10.24] over 300 rounds.

Client n runs PFLDyn(Proto)'s local steps (``pfldyn_proto``), then its upload Delta w_n passes through
``chain(clip(C), local Gaussian(z), uniform mean)``: Delta w_n / max(1, ||Delta w_n|| / C) +
N(0, (z C)^2 I), sent to the server, which averages and takes PFLDyn's server step (post-processing).

Privacy unit (a stated choice): one client's local data, replace-one, each participation a Gaussian of
sensitivity 2C (any two clipped uploads differ by at most 2C) composed exactly per client (GDP, no
amplification by sampling: the noise is added by the client and the server sees every upload), the
same accounting as CUAG-PFL's sound mode, so the two compare. Zheng et al.'s own PriFedSync is
example-level (NoisySGD inside local training, composed by the f-DP central limit theorem); that
reading does not carry over to PFLDyn(Proto): an example in the prototype batch D moves every class
prototype and so every loss term of D', and no per-example clip bounds its effect on the step. With
z = 0.45 the client-level epsilon is large (each participation alone is (2 / 0.45)-GDP); the run
reports the exact figure, not the seed's [0.41, 10.24], which follows neither accounting.
"""

from __future__ import annotations

from fedjax_dp.algorithms import registry
from fedjax_dp.algorithms.pfldyn_proto import build_pfldyn_algorithm, check_pfldyn
from fedjax_dp.core.uploads import UniformWeights, chain
from fedjax_dp.privacy.client_sampling import client_sampler
from fedjax_dp.privacy.tracker import PrivacyTracker, ledger_settings
from fedjax_dp.privacy.upload_clipping import FlatClip
from fedjax_dp.privacy.upload_noise import GaussianNoise


def build_prifedsync(ctx) -> tuple:
    p = ctx.cfg.prifedsync
    uploads = chain(FlatClip(p.clip_norm), GaussianNoise(((1, float(p.noise_multiplier)),), local=True),
                    UniformWeights())
    return build_pfldyn_algorithm(ctx), uploads


def make_tracker(cfg, dataset, uploads):
    """Per-client exact GDP composition of the participations each client ran (no budget: fixed noise)."""
    return PrivacyTracker(uploads.releases, ledger_settings(cfg.prifedsync.delta),
                          client_sampler(cfg.sampling, dataset.num_clients))


def check_prifedsync(cfg, need) -> None:
    check_pfldyn(cfg, need)
    p = cfg.prifedsync
    need(p.clip_norm > 0, f"prifedsync.clip_norm C must be > 0, got {p.clip_norm}")
    need(p.noise_multiplier > 0, f"prifedsync.noise_multiplier z must be > 0 (noise std z C), got {p.noise_multiplier}")
    need(0 < p.delta < 1, f"prifedsync.delta must lie in (0, 1), got {p.delta}")


registry.register_section("prifedsync", {
    "clip_norm": 1.0,  # C: the fixed clip of each upload (seed 004: 1)
    "noise_multiplier": 0.45,  # z: local noise N(0, (z C)^2 I) per upload (seed 004: 0.45)
    "delta": 1e-5})
registry.register("prifedsync", build=build_prifedsync, sections=("pfldyn", "prifedsync"), validate=check_prifedsync,
                  tracker=make_tracker,
                  summary="PriFedSync (Zheng et al. 2021) as seed 004 runs it: PFLDyn(Proto) + fixed clip + fixed "
                          "local Gaussian noise")
