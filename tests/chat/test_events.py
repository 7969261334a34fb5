"""chat.events: this process's sockets get events straight into their outbox, from the
event loop or from any thread, in order."""

from __future__ import annotations

import asyncio
import threading

from asgiref.sync import sync_to_async

from chat import events


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
        got: list[dict] = []
        while len(got) < 50:
            got += await asyncio.wait_for(socket.take(), 5)
        thread.join()
        assert [e["i"] for e in got] == list(range(50))
        assert other.empty()  # another session's socket hears nothing
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
        assert await socket.take() == [{"type": "y"}]
        assert socket.empty()
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


def _delta(offset: int, text: str, message_id: int = 7, **extra: object) -> dict:
    return {"type": "delta", "message_id": message_id, "text": text, "offset": offset, **extra}


def test_back_to_back_deltas_of_one_reply_merge_into_one():
    merged = events.deltas_merged(
        [_delta(0, "a", emitted_at=1.0), _delta(1, "bc", emitted_at=2.0), _delta(3, "d")]
    )
    # The oldest emit time stays: a client measuring latency sees the worst piece of the run.
    assert merged == [_delta(0, "abcd", emitted_at=1.0)]


def test_deltas_merge_only_when_contiguous_and_of_the_same_reply():
    done = {"type": "done", "message": {"id": 7}}
    batch = [
        _delta(0, "a"),
        _delta(5, "b"),  # a gap: not contiguous
        _delta(6, "c", message_id=8),  # another reply
        done,
        _delta(7, "d", message_id=8),  # after another event: keeps its place
        {"type": "delta", "message_id": 8, "text": "e"},  # no offset: left alone
    ]
    assert events.deltas_merged(batch) == batch


async def test_take_returns_everything_queued_with_deltas_merged():
    socket = events.LocalSocket(session_id=45)
    socket.push(_delta(0, "he"))
    socket.push(_delta(2, "llo"))
    socket.push({"type": "done"})
    assert await socket.take() == [_delta(0, "hello"), {"type": "done"}]
    assert socket.empty()
    # Nothing queued: take waits for the next push.
    waiting = asyncio.ensure_future(socket.take())
    await asyncio.sleep(0)
    assert not waiting.done()
    socket.push(_delta(5, "!"))
    assert await asyncio.wait_for(waiting, 5) == [_delta(5, "!")]


async def test_a_failing_layer_logs_its_traceback_once_not_per_event(monkeypatch, caplog):
    """Redis down while replies stream: one traceback, not one per token (a 20 s outage
    logged ~1,500 a process)."""
    import logging

    class DownLayer:
        async def group_send(self, group, message):
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379.")

    monkeypatch.setattr(events, "get_channel_layer", lambda: DownLayer())
    monkeypatch.setattr(events, "_layer_failure_logged", None)
    caplog.set_level(logging.DEBUG, logger="chat.events")
    for offset in range(50):
        event = {"type": "delta", "message_id": 1, "text": "x", "offset": offset}
        await events.event_publish_async(session_id=1, event=event)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1 and loud[0].exc_info is not None


async def test_a_send_from_sync_code_outlives_the_request_that_ran_it():
    """A view's thread announces a stored message through the channel layer as its client
    leaves: Django cancels the request's task, and asgiref hands that cancellation to the task
    its async_to_sync made. The message still goes out, and the view's code after it (its
    reply's start) still runs."""
    started, release = asyncio.Event(), asyncio.Event()
    sent: list[tuple[str, dict]] = []

    class SlowLayer:
        async def group_send(self, group: str, message: dict) -> None:
            started.set()
            await release.wait()
            sent.append((group, message))

    went_on = threading.Event()

    def view() -> None:
        events.group_send_from_sync(SlowLayer(), "session-41", {"type": "chat.event"})
        went_on.set()

    request = asyncio.ensure_future(sync_to_async(view, thread_sensitive=False)())
    await asyncio.wait_for(started.wait(), 5)  # the send is on its way
    request.cancel()
    await asyncio.sleep(0.05)
    assert not went_on.is_set()  # the view waits for its send: its next one must not overtake
    release.set()
    # asgiref lets the request end as its sync code did: here, having gone on.
    await asyncio.wait_for(asyncio.gather(request, return_exceptions=True), 5)
    assert sent == [("session-41", {"type": "chat.event"})]
    assert went_on.is_set()
