"""Events a socket never got (a message the channel layer dropped) are not shown as a wrong
text or a reply that never ends (chat/socketsync.py): a delta past what the socket holds is
held back and the generating process asked for the text so far; a reply that went quiet is
checked in the database and its `done` sent."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from chat import socketsync
from chat.events import session_group
from chat.layers import memberships_drop, memberships_hold
from chat.models import ChatMessage, GeneratorLease, MessageStatus
from chat.shapes import delta_event
from tests.chat.wsclient import until as _until
from tests.chat.wsclient import ws_open as _open

pytestmark = pytest.mark.django_db(transaction=True)


async def _from_elsewhere(session_id: int, event: dict) -> None:
    """An event as another process publishes it, through the session's group."""
    layer = get_channel_layer()
    await layer.group_send(
        session_group(session_id), {"type": "chat.event", "event": event, "origin": "elsewhere"}
    )


def _reply_streaming_elsewhere(session) -> ChatMessage:
    from datetime import timedelta

    GeneratorLease.objects.update_or_create(
        process="elsewhere", defaults={"expires_at": timezone.now() + timedelta(minutes=5)}
    )
    return ChatMessage.objects.create(
        session=session,
        role="assistant",
        content="",
        status=MessageStatus.STREAMING,
        generator="elsewhere",
    )


async def test_a_lost_delta_is_not_shown_as_a_wrong_text(session, owner_cookie, monkeypatch):
    asked = []

    async def watch(*, session_id):
        asked.append(session_id)

    monkeypatch.setattr(socketsync, "reply_watch", watch)
    ws = await _open(session.pk, owner_cookie)
    await _from_elsewhere(session.pk, delta_event(message_id=7, text="Hello ", offset=0))
    assert (await ws.receive_json_from(timeout=2))["text"] == "Hello "
    # "big " was dropped on the way: what follows it is held back, and the text asked for.
    await _from_elsewhere(session.pk, delta_event(message_id=7, text="world", offset=10))
    assert await ws.receive_nothing(timeout=0.3)
    assert asked == [session.pk]
    # The generating process answers with the text so far, at offset 0.
    await _from_elsewhere(session.pk, delta_event(message_id=7, text="Hello big world", offset=0))
    event = await ws.receive_json_from(timeout=2)
    assert (event["offset"], event["text"]) == (6, "big world")
    await ws.disconnect()


async def test_a_lost_done_is_sent_from_the_database(session, owner_cookie, monkeypatch):
    monkeypatch.setattr(socketsync, "QUIET_SECONDS", 0.3)
    reply = await database_sync_to_async(_reply_streaming_elsewhere)(session)
    ws = await _open(session.pk, owner_cookie)
    assert (await ws.receive_json_from(timeout=2))["type"] == "message"  # the live reply
    await _from_elsewhere(session.pk, delta_event(message_id=reply.pk, text="All", offset=0))
    assert (await ws.receive_json_from(timeout=2))["text"] == "All"
    # It ends in the other process; its `done` never arrives here.
    await database_sync_to_async(
        lambda: ChatMessage.objects.filter(pk=reply.pk).update(
            content="All done.", status=MessageStatus.COMPLETE
        )
    )()
    done = (await _until(ws, "done", timeout=3))[-1]
    assert done["message"]["content"] == "All done." and done["message"]["status"] == "complete"
    await ws.disconnect()


async def test_live_sockets_renew_their_group_memberships(settings):
    import asyncio

    settings.CHANNEL_GROUP_EXPIRY_SECONDS = 0.15
    joined = []

    class Layer:
        async def group_add(self, group, channel):
            joined.append((group, channel))

    memberships_hold(layer=Layer(), channel="c1", groups=("g1", "g2"), on_back=lambda: None)
    await asyncio.sleep(0.2)
    memberships_drop(channel="c1")
    assert joined[:2] == [("g1", "c1"), ("g2", "c1")]
    await asyncio.sleep(0.1)
    count = len(joined)
    await asyncio.sleep(0.2)
    assert len(joined) == count  # dropped: no longer renewed


async def test_a_redis_restart_that_lost_the_groups_rejoins_every_socket(settings, monkeypatch):
    """A Redis restarted empty loses every group, and sockets blocked in their read never see
    an error: the process notices its own key gone, joins every socket's groups again and
    tells each (the consumer closes it with 4012 so the client catches up)."""
    import asyncio

    from chat import layers

    monkeypatch.setattr(layers, "CANARY_SECONDS", 0.05)
    keys: set[str] = set()
    joined, told = [], []

    class Client:
        async def exists(self, key):
            return key in keys

        async def set(self, key, value, ex):
            keys.add(key)

    class Layer:
        prefix = "p:"

        def connection(self, index):
            return Client()

        async def group_add(self, group, channel):
            joined.append(group)

    memberships_hold(layer=Layer(), channel="c1", groups=("g1",), on_back=lambda: told.append(1))
    await asyncio.sleep(0.2)
    assert told == [] and joined == []  # the first look only plants the key
    keys.clear()  # the restart
    await asyncio.sleep(0.2)
    memberships_drop(channel="c1")
    assert told == [1] and joined == ["g1"]
