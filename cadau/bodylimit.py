"""A ceiling on HTTP request bodies, enforced before Django sees the request.

Django's ASGI handler reads a request's whole body (into a spooled temporary file) before any
view or middleware runs, so a 100 MB body sent to an endpoint that needs no login was read in
full. Here a body announced (Content-Length) or found (while it streams in) to be over
HTTP_MAX_BODY_BYTES gets 413 in the API's JSON error shape, and what is left of it is never
read. Bodies under the ceiling are handed on unchanged."""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isascii() and text.isdigit() else -1
    return None


class BodySizeLimit:
    def __init__(self, app: Any, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and not 0 <= length <= self.max_bytes:
            await self._refuse(send, invalid=length < 0)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body was in
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._refuse(send, invalid=False)
                return
            chunks.append(body)
            if not message.get("more_body"):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return dict(await receive())

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any, *, invalid: bool) -> None:
        if invalid:
            status, code, message = 400, "bad_request", "The Content-Length header is not valid."
        else:
            status, code = 413, "request_too_large"
            message = f"The request body is over the limit of {self.max_bytes} bytes."
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
