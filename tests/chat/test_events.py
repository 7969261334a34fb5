"""chat.services.events: this process's sockets get events straight into their outbox, from the
event loop or from any thread, in order."""

from __future__ import annotations

import asyncio
import threading

from chat.services import events


async def test_events_from_another_thread_arrive_in_order_on_the_sockets_loop():
    socket = events.LocalSocket(session_id=41)
    other = events.LocalSocket(session_id=42)
    events.local_socket_add(socket)
    events.local_socket_add(other)
    try:

        def publish() -> None:  # e.g. a background compaction in a worker thread
            for i in range(50):
                events.event_publish_now(session_id=41, event={"type": "n", "i": i})

        thread = threading.Thread(target=publish)
        thread.start()
        got = [await asyncio.wait_for(socket.outbox.get(), 5) for _ in range(50)]
        thread.join()
        assert [e["i"] for e in got] == list(range(50))
        assert other.outbox.empty()  # another session's socket hears nothing
    finally:
        events.local_socket_remove(socket)
        events.local_socket_remove(other)
    assert 41 not in events._local and 42 not in events._local


async def test_local_false_reaches_only_other_processes():
    socket = events.LocalSocket(session_id=43)
    events.local_socket_add(socket)
    try:
        await events.event_publish_async(session_id=43, event={"type": "x"}, local=False)
        await events.event_publish_async(session_id=43, event={"type": "y"})
        assert socket.outbox.get_nowait() == {"type": "y"}
        assert socket.outbox.empty()
    finally:
        events.local_socket_remove(socket)


def test_publishing_to_a_socket_whose_loop_is_gone_is_harmless():
    async def make() -> events.LocalSocket:
        return events.LocalSocket(session_id=44)

    socket = asyncio.run(make())  # its loop is closed now
    events.local_socket_add(socket)
    try:
        events.event_publish_now(session_id=44, event={"type": "late"})
    finally:
        events.local_socket_remove(socket)


def test_the_in_memory_layer_is_not_shared_and_redis_is(settings):
    from channels.layers import InMemoryChannelLayer

    assert not events.layer_is_shared(None)
    assert not events.layer_is_shared(InMemoryChannelLayer())
    assert events.layer_is_shared(object())
