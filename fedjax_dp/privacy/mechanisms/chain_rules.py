"""The privacy rules every upload chain must pass,
registered with ``core.uploads.register_chain_rule`` when ``fedjax_dp.privacy`` is imported
(``import fedjax_dp`` does).

Refused: a noise transform without a clip before it (its std would be relative to no bound), two
noise transforms, compression between the clip and the noise (it changes the bound the noise is
calibrated to), central noise divided by the realised count (which would be released un-noised),
local noise after a server-side clip, and clipping or noise without uniform weights (an
example-weighted upload is not bounded by a clip of the update).
"""

from __future__ import annotations

from fedjax_dp.core.uploads import CohortLevel, register_chain_rule


@register_chain_rule
def noise_follows_a_clip(transforms, names: str) -> None:
    kinds = [t.kind for t in transforms]
    if kinds.count("noise") > 1:
        raise ValueError(
            f"upload chain {names} has {kinds.count('noise')} noise transforms; at most one"
        )
    if "noise" not in kinds:
        return
    noise = kinds.index("noise")
    if getattr(transforms[noise], "calibrated_to_bound", True) and "clip" not in kinds[:noise]:
        raise ValueError(
            f"upload chain {names}: noise before any clip (its scale would be relative to no "
            "sensitivity bound); put a clip transform first"
        )
    last_clip = max((i for i, kind in enumerate(kinds[:noise]) if kind == "clip"), default=noise)
    if "compress" in kinds[last_clip:noise]:
        raise ValueError(
            f"upload chain {names}: compression between the clip and the noise changes the bound"
            " the noise is calibrated to; clip the measurements (compress, then clip)"
        )
    weighting = [t for t in transforms if t.kind == "weighting"]
    if (
        not getattr(transforms[noise], "local", False)
        and weighting
        and not weighting[0].denominator > 0
    ):
        raise ValueError(
            f"upload chain {names}: central noise needs a fixed denominator (fixed_denominator(D)):"
            " dividing by the realised count would release it un-noised"
        )
    if getattr(transforms[noise], "local", False) and any(
        isinstance(t, CohortLevel) for t in transforms[:noise]
    ):
        raise ValueError(
            f"upload chain {names}: local noise after a server-side clip cannot be local"
        )


@register_chain_rule
def bounded_uploads_are_uniformly_weighted(transforms, names: str) -> None:
    kinds = [t.kind for t in transforms]
    if ("clip" in kinds or "noise" in kinds) and "weighting" not in kinds:
        raise ValueError(
            f"upload chain {names}: clipping and noise need uniform weights (add"
            " fixed_denominator(D) or UniformWeights()): example-weighted uploads are not bounded"
        )
