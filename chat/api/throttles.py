"""DRF throttles over cadau.limits: a scope per route, its rate in settings.RATE_LIMITS.

Every API route counts against its user's `api_read` (GET) or `api_write` allowance (DRF's
default throttles, below). A route with a scope of its own lists both, e.g. `throttle_classes =
[*API_THROTTLES, per_user("session_create")]`; only the named methods count (POST by default),
so reading a list never spends a creation allowance.
Over the limit DRF raises Throttled, which our exception handler answers with 429, the JSON
error shape (`throttled`) and Retry-After.

Adding a limit: a default in cadau/rates.py's RATE_DEFAULTS (which also makes it
THROTTLE_<SCOPE> in the environment) and the class on the view. Outside DRF (a WebSocket
frame) call cadau.limits.limit_hit(_async) with the same scope and `user_ident(user)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rest_framework.exceptions import Throttled
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from cadau import limits, logins

if TYPE_CHECKING:
    # Only for the types: rest_framework.views reads the default throttles (these classes) as
    # it defines APIView, so importing it here is a circle.
    from rest_framework.views import APIView

# Set on a request a throttle refused (a Request takes attributes of its own).
_REFUSED = "_cadau_throttle_refused"


def user_ident(user: Any) -> str:
    return f"user:{user.pk}"


class ScopedThrottle(BaseThrottle):
    """Counts the requests of `methods` under `scope`; subclasses say whose they are."""

    scope: ClassVar[str] = ""
    methods: ClassVar[frozenset[str]] = frozenset({"POST"})

    def __init__(self) -> None:
        self._wait: int | None = None

    def ident(self, request: Request) -> str | None:
        raise NotImplementedError

    def allow_request(self, request: Request, view: APIView) -> bool:
        # Django answers HEAD with the GET view: the same work, so the same count.
        method = "GET" if request.method == "HEAD" else request.method
        if method not in self.methods:
            return True
        # DRF asks every throttle of the view, even after one refused: a request refused by
        # the general allowance must not spend the route's own as well (a "20/day" scope
        # would be gone after a burst the general one refused).
        if getattr(request, _REFUSED, False):
            return True
        ident = self.ident(request)
        if ident is None:
            return True
        self._wait = limits.limit_hit(scope=self.scope, ident=ident)
        if self._wait is not None:
            setattr(request, _REFUSED, True)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait


class UserThrottle(ScopedThrottle):
    """Per logged-in user (by address for anonymous callers, who are refused anyway)."""

    def ident(self, request: Request) -> str | None:
        return _user_or_address(request)


def _user_or_address(request: Request) -> str:
    user = request.user
    if user is not None and user.is_authenticated:
        return user_ident(user)
    return f"ip:{logins.client_ip(request)}"


def _scoped(
    base: type[ScopedThrottle], scope: str, methods: tuple[str, ...]
) -> type[ScopedThrottle]:
    name = f"{base.__name__}_{scope}"
    return type(name, (base,), {"scope": scope, "methods": frozenset(methods)})


def per_user(scope: str, *, methods: tuple[str, ...] = ("POST",)) -> type[ScopedThrottle]:
    return _scoped(UserThrottle, scope, methods)


class ApiReadThrottle(UserThrottle):
    """Every API read of a user (settings.REST_FRAMEWORK's default): a route without a scope of
    its own (history pages, rendered replies, a session's context) is still bounded, so one
    account cannot keep the HTTP threads busy for everyone."""

    scope = "api_read"
    methods = frozenset({"GET", "OPTIONS"})


class ApiWriteThrottle(UserThrottle):
    """Every API write of a user, as ApiReadThrottle: deletions, truncations, agent and memory
    edits."""

    scope = "api_write"
    methods = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def write_refused_count(request: Request) -> None:
    """A write its view refused before any throttle counted it (a send's body that does not
    validate: sends count `chat_send` in the turn service, after validation) spends the
    user's `api_write` allowance; Throttled (429) once that is spent. Else a client could post
    2.5 MB bodies that never validate, without any limit."""
    wait = limits.limit_hit(scope=ApiWriteThrottle.scope, ident=_user_or_address(request))
    if wait is not None:
        raise Throttled(wait=wait)


# A view that lists throttles of its own replaces DRF's default list: it starts with these.
API_THROTTLES: list[type[ScopedThrottle]] = [ApiReadThrottle, ApiWriteThrottle]
