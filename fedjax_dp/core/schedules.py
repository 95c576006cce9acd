"""Piecewise-constant per-round schedules, ``'round:value,...'`` in a config: a noise multiplier z_t
(``dp.noise_schedule``) or a sampling rate q_t (``sampling.rate_schedule``, Geyer et al. 2017's
m_t)."""

from __future__ import annotations


def parse_schedule(
    text: str, default: float, key: str = "dp.noise_schedule", unit: str = "z"
) -> tuple[tuple[int, float], ...]:
    """'1:1.0,50:0.8' -> ((1, 1.0), (50, 0.8)) (value from that round on); '' -> constant default.
    ``key`` and ``unit`` name the setting in errors."""
    if not text:
        return ((1, float(default)),)
    pairs = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 2:
            raise ValueError(f"{key}={text!r}: each item must be 'round:{unit}', got {item!r}")
        try:
            pairs.append((int(parts[0]), float(parts[1])))
        except ValueError:
            raise ValueError(
                f"{key}={text!r}: {item!r} is not 'round:{unit}' (an integer and a number)"
            ) from None
    if pairs[0][0] != 1 or any(b[0] <= a[0] for a, b in zip(pairs, pairs[1:])):
        raise ValueError(f"{key}={text!r} must start at round 1 with increasing rounds")
    return tuple(pairs)


def schedule_value(schedule: tuple, round_index: int) -> float:
    """The value of a piecewise-constant ``((start round, value), ...)`` schedule in round t."""
    return [v for start, v in schedule if start <= round_index][-1]
