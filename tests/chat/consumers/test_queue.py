"""One reply at a time per session over the consumer: concurrent sends queue and never
interleave; a send is refused when the queue wait ends or one is queued already."""

from __future__ import annotations

import asyncio

import pytest

from chat.models import MessageRole
from tests.chat.consumers.helpers import (
    messages_of,
)
from tests.chat.wsclient import until as _until
from tests.chat.wsclient import ws_open as _open

# Replies run through database_sync_to_async, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


async def test_concurrent_sends_queue_and_never_interleave(session, owner_cookie, fake_llm):
    fake_llm.script(
        {"content": "first reply words", "token_ms": 15},
        {"content": "second reply words", "token_ms": 15},
    )
    a = await _open(session.pk, owner_cookie)
    b = await _open(session.pk, owner_cookie)
    watcher = await _open(session.pk, owner_cookie)
    await a.send_json_to({"type": "send", "content": "one"})
    await _until(watcher, "delta")
    await b.send_json_to({"type": "send", "content": "two"})
    events = await _until(watcher, "done")
    events += await _until(watcher, "done")
    # Each reply's deltas sit between its user message and its done, never mixed.
    order = [(e["type"], e.get("message_id") or e.get("message", {}).get("id")) for e in events]
    dones = [i for i, (kind, _) in enumerate(order) if kind == "done"]
    first_id, second_id = events[dones[0]]["message"]["id"], events[dones[1]]["message"]["id"]
    assert all(mid == first_id for kind, mid in order[: dones[0]] if kind == "delta")
    assert all(mid == second_id for kind, mid in order[dones[0] :] if kind == "delta")
    assert events[dones[0]]["message"]["content"] == "first reply words"
    assert events[dones[1]]["message"]["content"] == "second reply words"
    stored = await messages_of(session.pk)
    assert [m.content for m in stored] == ["one", "first reply words", "two", "second reply words"]
    for ws in (a, b, watcher):
        await ws.disconnect()


async def test_send_refused_with_reply_in_progress_when_the_queue_wait_ends(
    session, owner_cookie, fake_llm, settings
):
    settings.CHAT_SEND_QUEUE_SECONDS = 0.2
    fake_llm.script({"content": " ".join(f"w{i}" for i in range(40)), "token_ms": 20})
    a = await _open(session.pk, owner_cookie)
    b = await _open(session.pk, owner_cookie)
    await a.send_json_to({"type": "send", "content": "long one"})
    await _until(b, "delta")
    await b.send_json_to({"type": "send", "content": "me too"})
    refused = await _until(b, "error")
    assert refused[-1]["code"] == "reply_in_progress"
    await _until(a, "done")
    stored = await messages_of(session.pk)
    assert [m.content for m in stored if m.role == MessageRole.USER] == ["long one"]
    for ws in (a, b):
        await ws.disconnect()


async def test_a_second_send_on_the_same_socket_while_queued_is_refused(
    session, owner_cookie, fake_llm
):
    fake_llm.script(
        {"content": " ".join(f"w{i}" for i in range(15)), "token_ms": 15}, "second", "third"
    )
    ws = await _open(session.pk, owner_cookie)
    await ws.send_json_to({"type": "send", "content": "one"})
    await _until(ws, "delta")
    await ws.send_json_to({"type": "send", "content": "two"})  # queued behind "one"
    await asyncio.sleep(0.05)
    await ws.send_json_to({"type": "send", "content": "three"})  # refused: one queued already
    events = await _until(ws, "error")
    assert events[-1]["code"] == "reply_in_progress"
    await _until(ws, "done")
    await _until(ws, "done")  # "two" ran after "one"
    await ws.disconnect()
    stored = await messages_of(session.pk)
    assert [m.content for m in stored if m.role == MessageRole.USER] == ["one", "two"]
