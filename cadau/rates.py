"""Rate strings for the limits in settings ("20/min"), parsed without Django so that
cadau/settings.py can refuse a bad one at start-up."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PERIODS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
    "d": 86400,
    "day": 86400,
}
_RATE_RE = re.compile(r"([0-9]{1,9})/([a-z]+)")
OFF = "off"


@dataclass(frozen=True)
class Rate:
    count: int  # requests allowed ...
    seconds: int  # ... per this many seconds


def rate_parse(value: str) -> Rate | None:
    """ "N/period" (period: s, m/min/minute, h/hour, d/day) → Rate; "off" → None (no limit).
    ValueError for anything else, including 0 requests (write "off" to mean unlimited)."""
    text = value.strip().lower()
    if text == OFF:
        return None
    match = _RATE_RE.fullmatch(text)
    if not match or match[2] not in _PERIODS:
        raise ValueError(f"expected N/period (period s, min, hour or day) or 'off', got {value!r}")
    count = int(match[1])
    if count <= 0:
        raise ValueError(f"{value!r} allows nothing: use 'off' to turn a limit off")
    return Rate(count, _PERIODS[match[2]])
