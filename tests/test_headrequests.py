"""cadau/headrequests.py: a HEAD gets no body, from the app (a streamed body is never started)
and at the ASGI edge (tests/test_serve.py checks the bytes on a real connection)."""

from __future__ import annotations

import asyncio

from django.http import HttpResponse, StreamingHttpResponse
from django.test import RequestFactory

from cadau.headrequests import HeadWithoutBodyMiddleware, bodiless_send


def _streamed(started: list[str]) -> StreamingHttpResponse:
    def body():
        started.append("yes")
        yield b"a whole session"

    return StreamingHttpResponse(body())


def test_a_heads_streamed_body_is_never_started_a_gets_is():
    started: list[str] = []
    middleware = HeadWithoutBodyMiddleware(lambda request: _streamed(started))
    head = middleware(RequestFactory().head("/x"))
    assert b"".join(head.streaming_content) == b"" and started == []
    get = middleware(RequestFactory().get("/x"))
    assert b"".join(get.streaming_content) == b"a whole session" and started == ["yes"]
    plain = HeadWithoutBodyMiddleware(lambda request: HttpResponse(b"x"))(
        RequestFactory().head("/x")
    )
    assert plain.content == b"x"  # not streamed: the edge below leaves its bytes out


def test_an_async_streamed_body_stays_async_and_is_never_started():
    started: list[str] = []

    async def body():
        started.append("yes")
        yield b"a whole session"

    middleware = HeadWithoutBodyMiddleware(lambda request: StreamingHttpResponse(body()))
    head = middleware(RequestFactory().head("/x"))
    assert head.is_async  # Django would warn, draining a sync iterator under ASGI

    async def drained() -> bytes:
        return b"".join([part async for part in head.streaming_content])

    assert asyncio.run(drained()) == b"" and started == []


def test_the_edge_sends_the_headers_and_one_empty_body():
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def respond() -> None:
        out = bodiless_send(send)
        await out({"type": "http.response.start", "status": 200, "headers": []})
        await out({"type": "http.response.body", "body": b"a" * 70_000, "more_body": True})
        await out({"type": "http.response.body", "body": b"b", "more_body": False})

    asyncio.run(respond())
    assert sent == [
        {"type": "http.response.start", "status": 200, "headers": []},
        {"type": "http.response.body", "body": b"", "more_body": False},
    ]
