"""A server-sent-events send whose client leaves mid-reply: Django cancels the task writing the
response. The response ends with that cancellation and nothing else (no RuntimeError from
closing the events' generator while a step still ran it, no wait left pending), and the reply
goes on and is stored."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest
from channels.db import database_sync_to_async

from tests.chat.wsclient import loop_left_clean  # noqa: F401 (autouse)
from tests.factories import ChatSessionFactory
from tests.helpers import reply_settled, token_stream_send

pytestmark = pytest.mark.django_db(transaction=True)

LONG = " ".join(f"w{i}" for i in range(100))  # ~2 s at 20 ms a token


async def test_a_stream_whose_client_left_ends_cleanly_and_its_reply_is_stored(
    owner, fake_llm, caplog
):
    session = await database_sync_to_async(ChatSessionFactory)(owner=owner)
    fake_llm.script({"content": LONG, "token_ms": 20})
    response = await database_sync_to_async(token_stream_send)(owner, session)
    assert response.status_code == 200
    started = asyncio.Event()

    async def write() -> None:
        async for chunk in response.streaming_content:
            if b"event: delta" in chunk:
                started.set()

    writing = asyncio.ensure_future(write())
    await asyncio.wait_for(started.wait(), 10)
    writing.cancel()  # as Django's ASGI handler does when the client disconnects
    (outcome,) = await asyncio.gather(writing, return_exceptions=True)
    assert isinstance(outcome, asyncio.CancelledError), repr(outcome)
    reply = await reply_settled(session)
    assert reply.status == "complete" and reply.content == LONG
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()  # a task still pending is reported when it is collected
    assert not [r for r in caplog.records if "pending" in r.getMessage()], caplog.text


async def test_a_json_send_whose_client_left_still_completes_its_reply(owner, fake_llm):
    """A JSON (not streamed) send awaits the whole reply on the loop; a client that leaves
    meanwhile has that wait cancelled, and it took the reply down with it (stored
    `cancelled` with what had arrived): docs/api.md says the reply does not depend on the
    connection."""
    from chat.turn import turn_send

    session = await database_sync_to_async(ChatSessionFactory)(owner=owner)
    fake_llm.script({"content": LONG, "token_ms": 20})
    run = await database_sync_to_async(turn_send)(
        user=owner, session_id=session.pk, content="talk", client_id=None
    )
    waiting = asyncio.ensure_future(run.result())
    await asyncio.sleep(0.5)  # some of the reply is in
    waiting.cancel()  # as Django's ASGI handler does when the client disconnects
    (outcome,) = await asyncio.gather(waiting, return_exceptions=True)
    assert isinstance(outcome, asyncio.CancelledError), repr(outcome)
    reply = await reply_settled(session)
    assert reply.status == "complete" and reply.content == LONG
