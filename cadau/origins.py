"""The WebSocket handshake's Origin check.

Browsers attach no CSRF token to a WebSocket handshake, but they do send the page's Origin, and
the socket rides on the session cookie: a page on another site (or another port of this host,
which browsers treat as another site) that can open a socket can chat as the user. Channels'
AllowedHostsOriginValidator compares only the Origin's host with ALLOWED_HOSTS, so
`http://localhost:9999` passed for a server on `http://localhost:8000`. This compares scheme,
host and port, the way Django's CSRF check compares a form post's Origin:

* the request's own origin, as a browser on our page sends it: `http` or `https` (the scope's
  scheme, or the proxy's SECURE_PROXY_SSL_HEADER when one is declared, as request.is_secure()
  does) + the Host header, whose host must pass ALLOWED_HOSTS;
* or an origin listed in CSRF_TRUSTED_ORIGINS (exact scheme, host and port; `https://*.example.com`
  for subdomains), for a proxy that does not pass the public Host on.

No Origin (not a browser, or a browser that hides it: "null") is refused, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import SplitResult, urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

_DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int]  # scheme, lower-case host, port


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            try:
                return bytes(value).decode("latin1")
            except (TypeError, ValueError):
                return None
    return None


def _origin(parts: SplitResult) -> Origin | None:
    """(scheme, host, port) of an http(s) URL with nothing but scheme, host and port."""
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return None
    try:
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
    except ValueError:  # a port that is not a number, or out of range
        return None
    return parts.scheme, parts.hostname.lower(), port


def _parse_origin(value: str) -> Origin | None:
    try:
        return _origin(urlsplit(value.strip()))
    except ValueError:
        return None


def _is_secure(scope: dict[str, Any]) -> bool:
    if scope.get("scheme") in ("https", "wss"):
        return True
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if not proxy:
        return False
    meta_name, expected = proxy
    # Django's META name (HTTP_X_FORWARDED_PROTO) back to the header (x-forwarded-proto).
    header = meta_name.removeprefix("HTTP_").lower().replace("_", "-").encode()
    value = _header(scope, header)
    # A chain of proxies may list several; the first is what the client spoke to the edge.
    return value is not None and value.split(",", 1)[0].strip() == expected


def _request_origin(scope: dict[str, Any]) -> Origin | None:
    """The origin a browser on our own page sends: our scheme + the Host it connected to."""
    host = _header(scope, b"host")
    if not host:
        return None
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    scheme = "https" if _is_secure(scope) else "http"
    return _parse_origin(f"{scheme}://{host}")


def _trusted(origin: Origin, patterns: Iterable[str]) -> bool:
    scheme, host, port = origin
    for pattern in patterns:
        wildcard = "://*." in pattern
        allowed = _parse_origin(pattern.replace("://*.", "://", 1) if wildcard else pattern)
        if allowed is None or allowed[0] != scheme or allowed[2] != port:
            continue
        if host == allowed[1] or (wildcard and host.endswith("." + allowed[1])):
            return True
    return False


def websocket_origin_allowed(*, scope: dict[str, Any]) -> bool:
    raw = _header(scope, b"origin")
    origin = _parse_origin(raw) if raw else None
    if origin is None:
        return False
    if origin == _request_origin(scope):
        return True
    return _trusted(origin, settings.CSRF_TRUSTED_ORIGINS)


class SameOriginValidator:
    """ASGI middleware for the websocket router: refuses (HTTP 403 to a browser) a handshake
    whose Origin is not ours, before the session or the consumer is touched."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator only guards WebSocket connections")
        if websocket_origin_allowed(scope=scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
