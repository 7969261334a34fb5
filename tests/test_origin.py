"""The WebSocket handshake's Origin check (cadau/origins.py) and the CSP's connect-src.

A browser page at https://chat.example.com opens wss://chat.example.com/ws/...; its Origin
header is the page's scheme, host and port. Anything else is another site (or another port of
the same host, which browsers treat as another site too) and must be refused before the
consumer runs. A refused handshake closes with 1000 from Channels' denier; one that passes the
check reaches the consumer, which closes an anonymous socket with 4401."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator

from cadau.asgi import application
from chat.middleware import CONTENT_SECURITY_POLICY

pytestmark = pytest.mark.django_db(transaction=True)

PASSED = 4401  # the consumer's "not logged in": the Origin check let it through
REFUSED = 1000  # Channels' WebsocketDenier


async def _handshake(
    *, origin: str | None, host: str | None, scheme: str = "ws", extra: list | None = None
) -> int:
    headers: list[tuple[bytes, bytes]] = []
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if host is not None:
        headers.append((b"host", host.encode()))
    headers.extend(extra or [])
    ws = WebsocketCommunicator(application, "/ws/chat/1/", headers=headers)
    ws.scope["scheme"] = scheme
    connected, code = await ws.connect(timeout=5)
    assert not connected  # never logged in: at best the consumer refuses with 4401
    await ws.wait()
    return int(code)


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "expected"),
    [
        ("http://localhost", "localhost", "ws", PASSED),
        ("http://localhost:8000", "localhost:8000", "ws", PASSED),
        ("http://127.0.0.1:8000", "127.0.0.1:8000", "ws", PASSED),
        ("https://localhost", "localhost", "wss", PASSED),
        # The review's finding: another port of an allowed host was accepted.
        ("http://localhost:9999", "localhost", "ws", REFUSED),
        ("http://localhost:9999", "localhost:8000", "ws", REFUSED),
        # Another scheme: an http page must not drive a socket the https site serves, nor the
        # other way round.
        ("https://localhost", "localhost", "ws", REFUSED),
        ("http://localhost", "localhost", "wss", REFUSED),
        ("http://evil.example", "localhost", "ws", REFUSED),
        # A Host outside ALLOWED_HOSTS is refused even when the Origin matches it.
        ("http://evil.example", "evil.example", "ws", REFUSED),
        ("null", "localhost", "ws", REFUSED),
        ("", "localhost", "ws", REFUSED),
        ("localhost", "localhost", "ws", REFUSED),
        ("ftp://localhost", "localhost", "ws", REFUSED),
        ("http://localhost:notaport", "localhost", "ws", REFUSED),
        (None, "localhost", "ws", REFUSED),
        ("http://localhost", None, "ws", REFUSED),
    ],
)
async def test_origin_must_match_scheme_host_and_port(origin, host, scheme, expected):
    assert await _handshake(origin=origin, host=host, scheme=scheme) == expected


async def test_csrf_trusted_origins_are_allowed_exactly(settings):
    # Behind a proxy that rewrites Host, the public origin is declared in CSRF_TRUSTED_ORIGINS.
    settings.CSRF_TRUSTED_ORIGINS = ["https://chat.example.com", "https://*.example.org"]
    internal = "127.0.0.1:8001"
    assert await _handshake(origin="https://chat.example.com", host=internal) == PASSED
    assert await _handshake(origin="https://a.example.org", host=internal) == PASSED
    assert await _handshake(origin="http://chat.example.com", host=internal) == REFUSED
    assert await _handshake(origin="https://chat.example.com:8443", host=internal) == REFUSED
    assert await _handshake(origin="https://example.org.evil.net", host=internal) == REFUSED


async def test_proxy_ssl_header_makes_the_request_https(settings):
    # The TLS proxy speaks plain HTTP to us and says so in X-Forwarded-Proto.
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proto = [(b"x-forwarded-proto", b"https")]
    assert await _handshake(origin="https://localhost", host="localhost", extra=proto) == PASSED
    assert await _handshake(origin="http://localhost", host="localhost", extra=proto) == REFUSED
    # Without the declared header the scope's own scheme decides.
    settings.SECURE_PROXY_SSL_HEADER = None
    assert await _handshake(origin="https://localhost", host="localhost", extra=proto) == REFUSED


def test_wildcard_allowed_hosts_still_needs_the_same_origin(settings):
    from cadau.origins import websocket_origin_allowed

    settings.ALLOWED_HOSTS = ["*"]

    def scope(origin: str, host: str) -> dict:
        return {
            "type": "websocket",
            "scheme": "ws",
            "headers": [(b"origin", origin.encode()), (b"host", host.encode())],
        }

    assert websocket_origin_allowed(scope=scope("http://chat.example.com", "chat.example.com"))
    assert not websocket_origin_allowed(scope=scope("http://evil.example", "chat.example.com"))


def test_csp_connect_src_is_self_only():
    directives = dict(part.partition(" ")[::2] for part in CONTENT_SECURITY_POLICY.split("; "))
    assert directives["connect-src"] == "'self'"
    assert "ws:" not in CONTENT_SECURITY_POLICY and "wss:" not in CONTENT_SECURITY_POLICY
