"""How events reach the consumer's sockets (chat/events.py): pieces a socket already holds,
layer messages of this process and of others, a client too slow for its events."""

from __future__ import annotations

import pytest
from channels.layers import get_channel_layer

from chat import events
from tests.chat.consumers.helpers import (
    TIMEOUT,
)
from tests.chat.wsclient import ws_open as _open

# Replies run through database_sync_to_async, which cannot share a test transaction.
pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_piece_the_socket_already_holds_is_cut_off(session, owner_cookie):
    """A catch-up from another process repeats the text so far at offset 0: the socket sends on
    only what its client lacks, so the client never shows a piece twice."""
    ws = await _open(session.pk, owner_cookie)
    for event in (
        {"type": "delta", "message_id": 7, "text": "Hello ", "offset": 0},
        {"type": "delta", "message_id": 7, "text": "Hello world", "offset": 0},
        {"type": "delta", "message_id": 7, "text": "Hello", "offset": 0},
        {"type": "delta", "message_id": 7, "text": "!", "offset": 11},
    ):
        await events.event_publish_async(session_id=session.pk, event=event)
    got = [await ws.receive_json_from(timeout=TIMEOUT) for _ in range(3)]
    assert [(e["offset"], e["text"]) for e in got] == [(0, "Hello "), (6, "world"), (11, "!")]
    assert await ws.receive_nothing(timeout=0.1)
    await ws.disconnect()


async def test_layer_messages_of_this_process_are_skipped_and_others_forwarded(
    session, owner_cookie
):
    """This process's events reach its sockets directly; the same event coming back through a
    shared layer must not be sent twice. Events of other processes are forwarded."""
    ws = await _open(session.pk, owner_cookie)
    layer = get_channel_layer()
    group = events.session_group(session.pk)
    mine = {"type": "compaction", "state": "started"}
    theirs = {"type": "compaction", "state": "done"}
    await layer.group_send(group, {"type": "chat.event", "event": mine, "origin": events.ORIGIN})
    await layer.group_send(group, {"type": "chat.event", "event": theirs, "origin": "elsewhere"})
    assert await ws.receive_json_from(timeout=TIMEOUT) == theirs
    assert await ws.receive_nothing(timeout=0.1)
    await ws.disconnect()


async def test_a_client_too_slow_for_its_events_is_closed_4408(session, owner_cookie, monkeypatch):
    monkeypatch.setattr(events, "OUTBOX_LIMIT", 5)
    ws = await _open(session.pk, owner_cookie)
    for i in range(10):  # queued without yielding: more than the socket could send meanwhile
        events.event_publish_local(
            session_id=session.pk,
            event={"type": "delta", "message_id": 1, "text": "x", "offset": i},
        )
    closed = None
    while closed is None:
        output = await ws.receive_output(timeout=TIMEOUT)
        if output["type"] == "websocket.close":
            closed = output
    assert closed["code"] == 4408
    await ws.disconnect()
