"""Traffic accounting: bytes actually sent per client and round (seed 004, Table 2 and Fig. 7 report
uplink and total traffic in GB).

Counts are of what is transmitted: float32 arrays at 4 bytes per value, plus side information (a
compressed upload also carries one float32 rate per layer so the server can rebuild the operators;
random operators need no matrix, only the shared seed, counted as 8 bytes). The download is every
floating-point array an algorithm broadcasts (``Algorithm.broadcast``): the global model, plus e.g.
SCAFFOLD's control variate (``broadcast_bytes``); the round index that goes with it is not counted,
as no upload counts its client's id.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

FLOAT32_BYTES = 4
SEED_BYTES = 8


def array_bytes(tree) -> int:
    """Bytes of every array in a pytree as sent (its dtype's item size times its entry count)."""
    return int(
        sum(
            np.dtype(x.dtype).itemsize * int(np.prod(x.shape))
            for x in jax.tree_util.tree_leaves(tree)
        )
    )


def broadcast_bytes(shared) -> int:
    """Bytes of the floating-point arrays of what the server broadcasts (model, control
    variates...)."""
    return array_bytes(
        [
            x
            for x in jax.tree_util.tree_leaves(shared)
            if np.issubdtype(np.dtype(x.dtype), np.floating)
        ]
    )


def dense_upload_bytes(params, copies: int = 1) -> int:
    """An uncompressed float32 update (``copies`` = 2 for SCAFFOLD's model and control deltas)."""
    return (
        copies
        * FLOAT32_BYTES
        * sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    )


def compressed_upload_bytes(compressor) -> int:
    """Measurements plus side information (one rate per layer; a seed for random operators)."""
    layers = len(compressor.operators)
    side = FLOAT32_BYTES * layers + (SEED_BYTES if compressor.kind != "block" else 0)
    return FLOAT32_BYTES * compressor.num_measurements + side


@dataclasses.dataclass
class TrafficMeter:
    """Accumulates uplink / downlink bytes over rounds; ``row`` gives the per-round metrics."""

    uplink: int = 0
    downlink: int = 0

    def record(self, clients: int, upload_bytes: int, download_bytes: int) -> dict:
        if clients < 0 or upload_bytes < 0 or download_bytes < 0:
            raise ValueError(
                f"traffic counts must be >= 0, got {clients}, {upload_bytes}, {download_bytes}"
            )
        up, down = clients * upload_bytes, clients * download_bytes
        self.uplink += up
        self.downlink += down
        return {
            "uplink_bytes": up,
            "downlink_bytes": down,
            "uplink_gb_total": self.uplink / 1e9,
            "traffic_gb_total": (self.uplink + self.downlink) / 1e9,
        }
