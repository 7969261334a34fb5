"""Small helpers shared by test modules (fixtures live in conftest.py, factories in
factories.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from asgiref.sync import async_to_sync
from django.core.cache import cache

from agentmemory.hooks import memory_prompt_part
from cadau import limits
from chat.context import (
    Payload,
    context_compact,
    context_compaction_decide,
    context_payload_build,
    context_state_fresh,
)
from chat.llm import transport, window
from chat.models import ChatMessage, ChatSession
from chat.turn import service


async def replies_wait(*, timeout: float = 30.0) -> None:
    """Wait until the replies started on this event loop have finished, after-reply work
    included. For a loop about to close (tests serve each streamed response on a loop of its
    own): a server's loop outlives its replies, and a reply cancelled at loop shutdown
    instead of finishing was seen to hang there on PostgreSQL + Redis."""
    loop = asyncio.get_running_loop()
    mine = [task for task in service._tasks if task.get_loop() is loop]
    if mine:
        await asyncio.wait(mine, timeout=timeout)


def token_client(user: Any) -> Any:
    """An API client that authenticates `user` with a new token, as a program would."""
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def token_stream_send(user: Any, session: ChatSession, content: str = "talk") -> Any:
    """A send of `user`'s, with a token, asking for the reply as server-sent events: the
    streaming response, not yet read."""
    return token_client(user).post(
        "/api/v1/chat/send",
        {"session_id": session.pk, "content": content},
        format="json",
        HTTP_ACCEPT="text/event-stream",
    )


async def reply_settled(session: ChatSession, *, seconds: float = 20.0) -> ChatMessage:
    """The session's one reply, once it is no longer `streaming` (replies outlive their
    streams: a stream that ended early leaves its reply to finish and be stored)."""
    from channels.db import database_sync_to_async

    read = database_sync_to_async(
        lambda: ChatMessage.objects.filter(session=session, role="assistant").get()
    )
    for _ in range(int(seconds * 10)):
        reply: ChatMessage = await read()
        if reply.status != "streaming":
            return reply
        await asyncio.sleep(0.1)
    raise AssertionError(f"the reply of session {session.pk} is still streaming")


def limits_clear() -> None:
    """Forget every rate-limit counter and lockout. Only this app's keys: the Redis database
    may be shared with the channel layer."""
    limits._fallback.clear()  # the counters of a spell without Redis
    backend = getattr(cache, "_cache", None)
    if backend is None or not hasattr(backend, "get_client"):
        cache.clear()  # local memory: this process's own store
        return
    client = backend.get_client(None, write=True)
    for pattern in (cache.make_key(f"{limits.PREFIX}:*"), cache.make_key("login:*")):
        batch = list(client.scan_iter(match=pattern, count=500))
        if batch:
            client.delete(*batch)


def window_forget() -> None:
    """Start from nothing learned about any model's window or tokenizer."""
    with window._lock:
        window._learned.clear()
        window._overflows.clear()
        window._factor.clear()
        window._readings.clear()
        window._asked.clear()


async def loop_transports_close() -> None:
    """Close every aiohttp transport made on the running loop: a test that ran the ASGI
    application ends a loop marked long-lived, which a server process never does."""
    for made in list(transport._open.pop(asyncio.get_running_loop(), ())):
        await made.aclose()


def memory_system_prompt(*, session: ChatSession, query: str = "") -> str:
    """The long-term memory a call for `query` carries in its system prompt ("" for none)."""
    part = memory_prompt_part(session=session)
    return part(query) if part is not None else ""


def sse_events(response: Any) -> list[dict[str, Any]]:
    """The JSON events of a server-sent-events response from the Django test client (whose
    streaming content is an async iterator under ASGI views)."""

    async def collect() -> bytes:
        body = b"".join([chunk async for chunk in response.streaming_content])
        # The stream ends at `done`; the reply's task goes on (after-reply hooks, leaving the
        # control group) on this loop, which closes when this returns.
        await replies_wait()
        return body

    return sse_parse(async_to_sync(collect)().decode())


def sse_parse(body: str) -> list[dict[str, Any]]:
    """The JSON events of a server-sent-events body."""
    return [
        json.loads(line[6:])
        for block in body.split("\n\n")
        for line in block.splitlines()
        if line.startswith("data: ")
    ]


def streamed_body(response: Any) -> bytes:
    """The whole body of a streaming response whose content is an async iterator."""

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


def send_streaming(api: Any, session: Any, content: str) -> list[dict[str, Any]]:
    """POST /api/v1/chat/send with `Accept: text/event-stream`; the events it streamed."""
    response = api.post(
        "/api/v1/chat/send",
        {"session_id": session.pk, "content": content},
        format="json",
        HTTP_ACCEPT="text/event-stream",
    )
    assert response.status_code == 200, response.content
    return sse_events(response)


def context_payload(*, session_id: int, query: str = "", compact: bool = True) -> Payload:
    """Read the session's context and build its payload, compacting first (and waiting) when
    the decision says a send would (`compact`); what a send does, without storing a turn."""
    state = context_state_fresh(session_id=session_id, query=query)
    compactions = []
    if compact and context_compaction_decide(state=state) != "none":
        result = context_compact(session_id=session_id, trigger="before_send", query=query)
        compactions.append(result)
        if result.changed:
            state = context_state_fresh(session_id=session_id, query=query)
    payload = context_payload_build(state=state)
    payload.rows_read += sum(r.rows_read for r in compactions)
    payload.compactions = compactions
    return payload
