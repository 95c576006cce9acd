"""The soundness rules of a correlated-noise plan: which strategies a participation scheme's
sensitivity or amplification covers. One source for each rule: ``NoisePlan`` refuses a plan that
breaks one, and config validation asks the same function about the configured plan before anything
is built.

* banded C under b-min-separation (or cyclic groups): at most b bands, so that a client's
  participations b rounds apart never share a band (the banded sensitivity, Choquette-Choo et al.
  2023, Thm. 2, covers nothing else);
* cyclic Poisson sampling (amplified BandMF): amplification by sampling is proved for b-banded
  strategies only (Choquette-Choo et al. 2023, Sec. 4): the identity or banded with at most b
  bands; a tree, BLT or dense strategy would be reported with amplification it does not have;
* dense: at most ``MAX_DENSE_ROUNDS`` rounds, and under cyclic groups b must divide the rounds;
* trees: at most ``MAX_MATERIALIZED_ROUNDS`` rounds; a restarted tree's period at most the rounds.
"""

from __future__ import annotations

from fedjax_dp.privacy.correlated import strategies
from fedjax_dp.privacy.correlated.participation import Participation


def problems(
    name: str, rounds: int, participation: Participation, bands: int = 0, period: int = 0
) -> dict[str, str]:
    """Each rule the plan of strategy ``name`` over ``rounds`` rounds under ``participation``
    breaks: {rule: what is wrong, in words} (``bands``, ``period``: 0 = the strategy's default).
    The rules: ``bands``, ``amplification``, ``dense_rounds``, ``dense_groups``, ``restart``,
    ``tree_rounds``."""
    found = {}
    b, scheme = participation.min_separation, participation.scheme
    bands = bands or (strategies.default_span(rounds, participation) if name == "banded" else 1)
    if name == "banded" and scheme != "single" and bands > b:
        found["bands"] = (
            f"banded noise with {bands} bands under {participation.describe()}: a client's"
            f" participations {b} rounds apart would share a band, which the banded sensitivity"
            f" does not cover; use at most {b} bands"
        )
    if participation.amplified and name not in ("identity", "banded"):
        found["amplification"] = (
            f"{name!r} noise under {participation.describe()}: amplification by sampling is"
            " proved for banded strategies (amplified BandMF) only; use banded (or independent)"
            " noise, or cyclic groups without sampling"
        )
    if name == "dense" and rounds > strategies.MAX_DENSE_ROUNDS:
        found["dense_rounds"] = (
            f"dense noise is for short runs: at most {strategies.MAX_DENSE_ROUNDS} rounds, got"
            f" {rounds}; use blt or banded"
        )
    if name == "dense" and scheme == "cyclic" and rounds % b:
        found["dense_groups"] = f"dense noise with {b} cyclic groups: {b} must divide {rounds}"
    if name == "tree_restart" and period > rounds:
        found["restart"] = (
            f"a tree restarted every {period} rounds over {rounds} rounds would never restart; use"
            " one tree over the run"
        )
    trees = ("tree", "tree_restart", "tree_honaker")
    if name in trees and rounds > strategies.MAX_MATERIALIZED_ROUNDS:
        found["tree_rounds"] = (
            f"{name!r} noise is built for at most {strategies.MAX_MATERIALIZED_ROUNDS} rounds, got"
            f" {rounds}"
        )
    return found


def check(name: str, rounds: int, participation: Participation, bands: int = 0, period: int = 0):
    """Raises ``ValueError`` naming every rule the plan breaks (``problems``)."""
    found = problems(name, rounds, participation, bands, period)
    if found:
        raise ValueError("unsound correlated-noise plan: " + "; ".join(found.values()))
