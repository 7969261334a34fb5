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

# DRF's default throttles (settings.REST_FRAMEWORK), by dotted path: settings cannot import DRF.
API_THROTTLE_CLASSES = ["chat.api.throttles.ApiReadThrottle", "chat.api.throttles.ApiWriteThrottle"]

# The limits' defaults (cadau/settings.py RATE_LIMITS reads each from THROTTLE_<SCOPE> in the
# environment): scope -> "N/period" (s, min, hour, day) or "off".
RATE_DEFAULTS = {
    # Every login route (token endpoint, login form, admin login) per client address, and
    # per username across addresses: each guess costs ~0.3 s of password hashing.
    "login_ip": "20/min",
    "login_username": "10/min",
    # Per user: every API read and every write, whatever the route (a route's own scope below
    # counts as well). The page reads a history page per scroll step, debounced.
    "api_read": "600/min",
    "api_write": "120/min",
    "session_create": "30/min",
    # Reading a session's compaction history (the page's panel pages through it).
    "context_read": "120/min",
    # Whole-session downloads (each walks the session's every message).
    "session_export": "10/min",
    # Message search: the page searches as the user types (debounced), so a burst is normal.
    "message_search": "120/min",
    "agent_create": "10/min",
    # Renaming a session (PATCH /chat/sessions/{id}): each is a write and a broadcast.
    "session_update": "30/min",
    # Compact now: each is a summarising model call, seconds of the model server's time.
    "session_compact": "10/min",
    # New agent memory entries over the API: each writes a file and rebuilds the agent's index.
    "memory_entry_create": "30/min",
    # Messages a user may send (and replies regenerate), REST and WebSocket together.
    "chat_send": "30/min",
    # Chats opened whose recall window is read ahead (chat/search/recall_warm.py): past it a
    # chat opens as before, and its first send reads the window itself.
    "recall_warm": "30/min",
}


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
