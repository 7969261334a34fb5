"""Login abuse: per-address and per-username rate limits on every login, and a lockout after
repeated failures, for the token endpoint, the login form and the admin's login alike.

Why not django-axes (8.3.1, the current release): it hooks authenticate() the same way, but
(1) its async middleware path (the one Django picks under ASGI when it is the innermost
middleware, as its docs ask) passes the credentials where the lockout callable expects the
original response; (2) it sends no Retry-After and keeps no lockout end time a response could
report (its cache handler slides the key's expiry); (3) on DRF's token view it flags the DRF
Request wrapper, which its middleware never sees, so the lockout would come back as a 400 from
the serializer. Each needs custom code around it; what remains of it is this module, on the
same cache counters as the API throttles (cadau/limits.py).

The lockout is per (username, address): LOGIN_FAILURE_LIMIT failures within
LOGIN_LOCKOUT_SECONDS lock that pair for LOGIN_LOCKOUT_SECONDS, during which even the right
password is refused without being checked (no hashing CPU spent). Per pair, not per username
alone, so a stranger cannot lock a user out from everywhere by typing wrong passwords for them;
guessing one username from many addresses is what the per-username rate limit (login_username)
is for. A successful login clears the pair's failures.

That per-username limit is shared by every address, so it could itself lock a user out: a
stranger sending ten wrong passwords a minute for someone kept them at 429 everywhere (a
probe). So an attempt is counted against it only when nothing else refused it first (the
pair's lockout, the address's limit), and never from an address the user logged in from
before (LOGIN_KNOWN_SECONDS): there the pair's lockout already bounds the guesses. A user
keeps logging in from where they usually do while their name is being guessed elsewhere.

Hooks: `user_login_failed` (sent by authenticate() for every failure, whoever called it) counts
failures; `LockoutBackend`, first in AUTHENTICATION_BACKENDS, refuses a locked pair for any
caller; the views (TokenView, `login_guarded`) check the lockout and the rate limits first so
they can answer 429 with Retry-After.
"""

from __future__ import annotations

import functools
import ipaddress
import math
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.shortcuts import render

from cadau import limits

# Scopes of settings.RATE_LIMITS shared by every login route, so alternating between the
# form and the token endpoint does not double an attacker's allowance.
SCOPE_IP = "login_ip"
SCOPE_USERNAME = "login_username"

USERNAME_MAX = 150  # Django's default username length; longer is hashed as is


def client_ip(request: Any) -> str:
    """The client's address as the limits count it: REMOTE_ADDR, nothing else, an IPv6 one by
    its /64 network. Behind a proxy the server sets it from the proxy's X-Forwarded-For
    (`daphne --proxy-headers`, `uvicorn --proxy-headers`), and the proxy must overwrite that
    header (nginx: `proxy_set_header X-Forwarded-For $remote_addr;`): a header a client can
    write is no basis for a limit."""
    return address_key(str(request.META.get("REMOTE_ADDR") or "unknown"))


def address_key(address: str) -> str:
    """`address` as one client: an IPv6 address by its /64, the network one subscriber is
    given (each of its 2^64 addresses counted apart, anyone holding one would have no limit);
    one that carries an IPv4 address by that address (IPv4-mapped, 6to4: an IPv4 address
    holds 65,536 /64s there; Teredo: the client's, not its relay's; NAT64's well-known prefix:
    every IPv4 client behind the translator would be one /64); anything else (IPv4,
    "unknown") as it is."""
    if len(address) > _ADDRESS_RUNES_MAX:
        return address  # no address: not parsed, not kept in the cache below
    return _address_key(address)


# An IPv6 address with a zone (fe80::1%eth0) is at most ~60 characters.
_ADDRESS_RUNES_MAX = 64
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@functools.lru_cache(maxsize=4096)
def _address_key(address: str) -> str:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address
    if not isinstance(parsed, ipaddress.IPv6Address):
        return address
    carried = parsed.ipv4_mapped or parsed.sixtofour or (parsed.teredo or (None, None))[1]
    if carried is None and parsed in _NAT64:
        carried = ipaddress.IPv4Address(int(parsed) & 0xFFFFFFFF)
    if carried is not None:
        return str(carried)
    return str(ipaddress.IPv6Network((parsed, 64), strict=False))


def username_key(username: object) -> str | None:
    """The limiter's stand-in for a username: case-folded and hashed; None when there is none
    (a missing or non-string field: the per-username limit has nothing to count)."""
    if not isinstance(username, str) or not username.strip():
        return None
    return limits.hashed(username.strip().casefold())


def _pair(request: Any, username: object) -> str | None:
    key = username_key(username)
    return None if key is None else limits.hashed(f"{key}|{client_ip(request)}")


def _lock_key(pair: str) -> str:
    return f"login:lock:{pair}"


def login_lockout_remaining(*, request: Any, username: object) -> int | None:
    """Seconds left of this (username, address) pair's lockout, or None when not locked."""
    pair = _pair(request, username)
    if pair is None or settings.LOGIN_FAILURE_LIMIT <= 0:
        return None
    until = limits.cache_call("get", _lock_key(pair))
    if until is None:
        return None
    left = float(until) - limits._now()
    return math.ceil(left) if left > 0 else None


def login_failure_record(*, request: Any, username: object) -> None:
    pair = _pair(request, username)
    limit = settings.LOGIN_FAILURE_LIMIT
    if pair is None or limit <= 0:
        return
    period = settings.LOGIN_LOCKOUT_SECONDS
    failures = limits.counter_bump(key=f"login:fail:{pair}", timeout=period)
    if failures >= limit:
        # add(), not set(): attempts during a lockout do not extend it.
        limits.cache_call("add", _lock_key(pair), limits._now() + period, timeout=period + 1)


def _known_key(pair: str) -> str:
    return f"login:known:{pair}"


def login_success_record(*, request: Any, username: object) -> None:
    pair = _pair(request, username)
    if pair is not None:
        limits.cache_call("delete_many", [f"login:fail:{pair}", _lock_key(pair)])
        # Its end kept as the value, as the lockout's: read against the limiter's clock.
        known = settings.LOGIN_KNOWN_SECONDS
        limits.cache_call("set", _known_key(pair), limits._now() + known, timeout=known + 1)


def login_attempt_wait(*, request: Any, username: object) -> tuple[int, str] | None:
    """For a login route, before checking the password: (seconds to wait, reason code) when
    the attempt must be refused, else None. Counts the attempt against the address's rate
    limit, then (unless that refused it, or the user logged in from here before) against the
    username's: see the module's docstring."""
    locked = login_lockout_remaining(request=request, username=username)
    if locked is not None:
        return locked, "login_locked"
    wait = limits.limit_hit(scope=SCOPE_IP, ident=client_ip(request))
    if wait is not None:
        return wait, "throttled"
    key, pair = username_key(username), _pair(request, username)
    if key is None or pair is None:
        return None
    # Known only while the pair's lockout bounds the guesses from there (LOGIN_FAILURE_LIMIT
    # 0 turns it off).
    known_until = limits.cache_call("get", _known_key(pair))
    if settings.LOGIN_FAILURE_LIMIT > 0 and known_until and float(known_until) > limits._now():
        return None
    wait = limits.limit_hit(scope=SCOPE_USERNAME, ident=key)
    return None if wait is None else (wait, "throttled")


# --- hooks -----------------------------------------------------------------------------------


def _on_login_failed(
    sender: Any, credentials: dict[str, Any], request: Any = None, **_: Any
) -> None:
    if request is not None:  # management commands authenticate without a request
        login_failure_record(request=request, username=credentials.get("username"))


def _on_logged_in(sender: Any, request: Any, user: Any, **_: Any) -> None:
    if request is not None:
        login_success_record(request=request, username=user.get_username())


def connect_signals() -> None:
    user_login_failed.connect(_on_login_failed, dispatch_uid="cadau_login_failed")
    user_logged_in.connect(_on_logged_in, dispatch_uid="cadau_logged_in")


class LockoutBackend:
    """First in AUTHENTICATION_BACKENDS: refuses a locked (username, address) pair for every
    caller of authenticate(), including any login view that does not check first. Raising
    PermissionDenied stops authenticate() before the password is hashed."""

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **_: Any
    ) -> None:
        if request is not None and login_lockout_remaining(request=request, username=username):
            raise PermissionDenied("login locked")
        return None

    # No get_user(): this backend never logs anyone in, and a backend with one would be what
    # login() and the test client's force_login() record in the session.


def login_guarded(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Wraps an HTML login view (ours, the admin's): a POST over a limit or into a lockout
    gets a 429 page with Retry-After instead of a password check."""

    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method == "POST":
            refused = login_attempt_wait(request=request, username=request.POST.get("username"))
            if refused is not None:
                seconds, reason = refused
                response = render(
                    request,
                    "registration/login_throttled.html",
                    {
                        "minutes": max(1, math.ceil(seconds / 60)),
                        "locked": reason == "login_locked",
                    },
                    status=429,
                )
                response["Retry-After"] = str(seconds)
                return response
        return view(request, *args, **kwargs)

    guarded.__name__ = getattr(view, "__name__", "login")
    guarded.__doc__ = view.__doc__
    return guarded
