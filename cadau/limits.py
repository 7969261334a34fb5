"""Rate limits: one counter per (scope, key, window) in the default cache.

The cache is Redis when REDIS_URL is set, so every server process counts against the same
allowance, and local memory otherwise (one process). A fixed window per rate period: the
first hit creates the counter (`add`, with the window's remaining time as its expiry), the
others increment it (`incr`, atomic in Redis and under a lock in local memory), so a burst
of parallel requests cannot all read "under the limit" before any of them writes, which is
what DRF's own SimpleRateThrottle (read a list, append, write it back) allows. While Redis
does not answer, counters live in this process's memory (`cache_call`): limits hold per
process, said once in the log, and no request fails for it. The price of
fixed windows is up to twice the rate across a window boundary; the answer is exact about
when the caller may come back (the window's end: Retry-After).

Scopes and their rates are `settings.RATE_LIMITS` ({"session_create": "30/min", ...}, each
overridable as THROTTLE_<SCOPE>); `limit_hit(scope=..., ident=...)` is the one entry point for
DRF throttles (chat/api/throttles.py), the login guard (cadau/logins.py) and anything else,
e.g. a WebSocket consumer (`await limit_hit_async(...)`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from functools import lru_cache
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.core.cache.backends.locmem import LocMemCache

from cadau.rates import Rate, rate_parse

PREFIX = "limit"
logger = logging.getLogger("cadau.limits")


def _now() -> float:
    # One place to read the clock, so tests can move it.
    return time.time()


@lru_cache(maxsize=64)
def _parsed(value: str) -> Rate | None:
    return rate_parse(value)


def rate_for(*, scope: str) -> Rate | None:
    """The configured rate of a scope; None (no limit) for "off" or a scope not configured."""
    value = getattr(settings, "RATE_LIMITS", {}).get(scope)
    return _parsed(value) if value else None


def hashed(value: str) -> str:
    """A cache-key-safe, bounded stand-in for a caller-supplied value (a username): the raw
    text never lands in Redis and cannot make a key long or odd."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


# Where counters go while the shared cache (Redis) does not answer: this process's memory, so
# limits still hold per process and requests are answered instead of failing with a 500.
_fallback = LocMemCache("cadau-limits-fallback", {"OPTIONS": {"MAX_ENTRIES": 100_000}})
# After a failure the shared cache is left alone this long: a refused connection is quick, a
# blackholed host costs a connect timeout per request.
RETRY_SHARED_AFTER_SECONDS = 5.0
_shared_down_until = 0.0
_shared_down = False
_state_lock = threading.Lock()


def _shared_failed() -> None:
    global _shared_down, _shared_down_until
    with _state_lock:
        _shared_down_until = time.monotonic() + RETRY_SHARED_AFTER_SECONDS
        first, _shared_down = not _shared_down, True
    if first:  # once per outage, not once per request
        logger.warning(
            "limits_shared_cache_unavailable: counting rate limits per process until it is back",
            exc_info=True,
        )


def _shared_answered() -> None:
    global _shared_down
    if _shared_down:
        with _state_lock:
            back, _shared_down = _shared_down, False
        if back:
            logger.warning("limits_shared_cache_back: rate limits are shared again")


def cache_call(op: str, *args: Any, **kwargs: Any) -> Any:
    """`cache.<op>(...)` on the shared cache, or on this process's memory while the shared
    one does not answer. A missing key's ValueError (incr) is the caller's, whichever cache."""
    if time.monotonic() >= _shared_down_until:
        try:
            result = getattr(cache, op)(*args, **kwargs)
        except ValueError:
            raise
        except Exception:
            _shared_failed()
        else:
            _shared_answered()
            return result
    return getattr(_fallback, op)(*args, **kwargs)


def counter_bump(*, key: str, timeout: int) -> int:
    """Atomically adds one to `key` (created at 1 with `timeout` seconds to live)."""
    if cache_call("add", key, 1, timeout=timeout):
        return 1
    try:
        return int(cache_call("incr", key))
    except ValueError:  # expired between add() and incr(), or the cache changed meanwhile
        cache_call("add", key, 1, timeout=timeout)
        return 1


def limit_hit(*, scope: str, ident: str, rate: Rate | None = None) -> int | None:
    """Counts one request of `ident` (a user id, an address, a hashed username) in `scope`.
    None when it is allowed; else the seconds until the window ends (>= 1, for Retry-After).
    `rate` defaults to the scope's configured one; with no rate nothing is counted."""
    rate = rate if rate is not None else rate_for(scope=scope)
    if rate is None:
        return None
    now = _now()
    window = int(now // rate.seconds)
    remaining = (window + 1) * rate.seconds - now
    # The key outlives its window by a second so a clock a little ahead elsewhere still finds it.
    key = f"{PREFIX}:{scope}:{ident}:{rate.seconds}:{window}"
    count = counter_bump(key=key, timeout=math.ceil(remaining) + 1)
    if count <= rate.count:
        return None
    return max(1, math.ceil(remaining))


limit_hit_async = sync_to_async(limit_hit, thread_sensitive=False)
