"""Core building blocks: the algorithm protocol, the generic round, upload-transform chains, the
cohort engine, local training under ``lax.scan``, per-client state stores and RNG discipline."""

from fedjax_dp.core.algorithm import Algorithm, ClientOut, Requirements, ServerState
from fedjax_dp.core.client_states import ClientStateStore
from fedjax_dp.core.cohort import CohortEngine
from fedjax_dp.core.local_training import make_local_trainer
from fedjax_dp.core.round import FederatedRound, RoundResult
from fedjax_dp.core.uploads import Chain, Release, UploadTransform, chain, fixed_denominator

__all__ = [
    "Algorithm",
    "ClientOut",
    "Requirements",
    "ServerState",
    "ClientStateStore",
    "CohortEngine",
    "make_local_trainer",
    "FederatedRound",
    "RoundResult",
    "Chain",
    "Release",
    "UploadTransform",
    "chain",
    "fixed_denominator",
]
