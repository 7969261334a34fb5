"""The API's query strings and paths must be UTF-8 text.

Django decodes a query string's percent-escapes as UTF-8 with errors replaced, so
`q=%FF%FE` reached the search as "\ufffd\ufffd" and was searched for: a request nobody wrote;
a path's likewise (`/memory/entries/%ff` was refused as the entry name "\ufffd", a probe).
Under /api/ such a query string or path is refused here, before Django, with a 400 in the API's
error shape (JSON bodies are checked by the API's parser, chat/api/parsers.py). Other pages keep
Django's lenient reading: they take no text from their query strings."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote_to_bytes

API_PREFIX = "/api/"


def query_string_is_utf8(raw: bytes) -> bool:
    """Whether every name and value of `raw`, once its percent-escapes are decoded, is UTF-8."""
    return not raw or _unescaped_is_utf8(raw.replace(b"+", b" "))


class QueryTextCheck:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope.get("path", "").startswith(API_PREFIX)
            and not (
                query_string_is_utf8(scope.get("query_string", b""))
                # The path as the client wrote it (the ASGI server gives it decoded too).
                and _unescaped_is_utf8(scope.get("raw_path") or b"")
            )
        ):
            await _refuse(send)
            return
        await self.app(scope, receive, send)


def _unescaped_is_utf8(raw: bytes) -> bool:
    """Whether `raw`, once its percent-escapes are decoded, is UTF-8."""
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


async def _refuse(send: Any) -> None:
    message = "The path or query string is not valid UTF-8 (after decoding its %-escapes)."
    body = json.dumps({"error": {"code": "bad_request", "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
