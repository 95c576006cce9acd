"""Optional TensorBoard scalars of a run (``tensorboardX``: ``pip install
"fedjax_dp[tensorboard]"``).

Every finite number of a ``metrics.jsonl`` row becomes a scalar at step = its round; ``tensorboard
--logdir <workdir>/tensorboard`` shows them."""

from __future__ import annotations

import math
import numbers


def require_tensorboardx():
    """The ``tensorboardX`` module, or an error that says how to install it (raised before any
    work)."""
    try:
        import tensorboardX
    except ImportError as error:
        raise ValueError(
            'tensorboard=True needs tensorboardX: pip install "fedjax_dp[tensorboard]" '
            "(or pip install tensorboardX)"
        ) from error
    return tensorboardX


class TensorBoardScalars:
    """A ``tensorboardX.SummaryWriter`` fed with metrics rows."""

    def __init__(self, logdir: str):
        self.logdir = logdir
        self._module = require_tensorboardx()
        self._writer = None

    def log(self, row: dict) -> None:
        if self._writer is None:  # created on the first row, so a refused run leaves no event file
            self._writer = self._module.SummaryWriter(self.logdir)
        for key, value in row.items():
            if (
                key != "round"
                and isinstance(value, numbers.Real)
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                self._writer.add_scalar(key, float(value), global_step=int(row["round"]))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
