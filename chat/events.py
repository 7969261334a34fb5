"""Session events (docs/api.md; built by chat/shapes.py) reach every socket of the session, in
every process. Only services publish, and events that announce stored rows go out after the
transaction commits.

Two paths, one per distance:

- Sockets of this process get each event straight into their outbox (`LocalSocket`), with no
  channel layer in between. A streamed reply is one event per token per socket: through the
  layer each one was a message to copy, queue and dispatch (Channels' consumer loop makes a task
  per message), which with 200 streaming sockets was about half the process's CPU
  (bench/realtime.py).
- Sockets of other processes get events through the channel layer group of the session, when
  the layer is shared (channels-redis). Every such message carries this process's `ORIGIN`, and
  a consumer drops messages of its own origin: it got them locally already. With the in-memory
  layer (one process) nothing goes through the layer at all.

Deltas are the exception to "every event goes to the group": a generation sends them through the
layer only while another process has a socket on its session (chat/turn/registry.py keeps
track, and sends the text so far when one turns up), so a process streaming to its own sockets
costs Redis nothing per token.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
import uuid
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from chat.shapes import Event

logger = logging.getLogger("chat.events")

# Who published a layer message: consumers skip their own process's (delivered locally).
ORIGIN = uuid.uuid4().hex[:16]
# A socket whose client reads slower than events arrive is closed past this backlog (it can
# reconnect and resume from the stored partial) instead of holding events without bound.
OUTBOX_LIMIT = 2000


# A failing layer (Redis down) is logged with its traceback once a minute, not once per
# event: a reply publishes an event per token.
LAYER_FAILURE_LOG_SECONDS = 60.0
_layer_failure_logged: float | None = None


def layer_failure_log(what: str, **context: Any) -> None:
    """Log a failed channel-layer call from an `except` block: with its traceback once a
    minute, the rest at debug."""
    global _layer_failure_logged
    now = time.monotonic()
    detail = " ".join(f"{key}={value}" for key, value in context.items())
    last = _layer_failure_logged
    if last is None or now - last >= LAYER_FAILURE_LOG_SECONDS:
        _layer_failure_logged = now
        logger.exception("%s %s (further layer failures this minute at debug)", what, detail)
    else:
        logger.debug("%s %s", what, detail, exc_info=True)


def session_group(session_id: int) -> str:
    return f"chat_session_{session_id}"


def layer_is_shared(layer: Any) -> bool:
    """True when the layer reaches other processes (channels-redis); the in-memory layer is
    this process only, where the local path already reaches every socket."""
    return layer is not None and not isinstance(layer, InMemoryChannelLayer)


class LocalSocket:
    """The outbox of one socket of this process. Events are queued from any thread and taken,
    in order and all at once, by the socket's own task (see ChatConsumer)."""

    def __init__(self, *, session_id: int) -> None:
        self.session_id = session_id
        self.loop = asyncio.get_running_loop()
        self._queue: collections.deque[Event] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self.overflowed = False

    def push(self, event: Event) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self._put(event)
            return
        # RuntimeError: the socket's loop is gone, and the socket with it.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._put, event)

    def _put(self, event: Event) -> None:
        if self.overflowed:
            return
        if len(self._queue) >= OUTBOX_LIMIT:
            self.overflowed = True
            logger.warning("chat_socket_outbox_full session=%s", self.session_id)
        self._queue.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._queue

    def holds_message(self, *message_ids: int) -> bool:
        """Whether a `message` event of one of `message_ids` is waiting here."""
        return any(
            e.get("type") == "message" and (e.get("message") or {}).get("id") in message_ids
            for e in self._queue
        )

    async def take(self) -> list[Event]:
        """Wait for events, then return every queued one, deltas merged (`deltas_merged`).
        Why all at once: a socket that fell behind catches up in a few frames instead of one
        frame (and one write) per token, so a busy process sends fewer, larger frames rather
        than building a backlog."""
        while not self._queue:
            waiter = self._waiter = self.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        taken = list(self._queue)
        self._queue.clear()
        return deltas_merged(taken) if len(taken) > 1 else taken


def deltas_merged(events: list[Event]) -> list[Event]:
    """`events` with each run of back-to-back deltas of one reply joined into one delta: the
    texts concatenated, `offset` of the first, `emitted_at` of the first (the oldest piece, so
    the latency a client measures is the worst of the run). Deltas merge only when each starts
    where the previous ended; anything else keeps its place."""
    merged: list[Event] = []
    for event in events:
        last = merged[-1] if merged else None
        if (
            last is not None
            and event.get("type") == "delta"
            and last.get("type") == "delta"
            and event.get("message_id") == last.get("message_id")
            and isinstance(last.get("offset"), int)
            and event.get("offset") == last["offset"] + len(last["text"])
        ):
            merged[-1] = {**last, "text": last["text"] + event["text"]}
        else:
            merged.append(event)
    return merged


# session id -> the sockets of this process on it. Replaced, never mutated, so a publisher in
# another thread iterates a stable tuple.
_local: dict[int, tuple[LocalSocket, ...]] = {}
_local_lock = threading.Lock()


def local_socket_add(socket: LocalSocket) -> None:
    with _local_lock:
        _local[socket.session_id] = (*_local.get(socket.session_id, ()), socket)


def local_socket_remove(socket: LocalSocket) -> None:
    with _local_lock:
        rest = tuple(s for s in _local.get(socket.session_id, ()) if s is not socket)
        if rest:
            _local[socket.session_id] = rest
        else:
            _local.pop(socket.session_id, None)


def local_sockets_open() -> bool:
    """Whether this process has a socket open on any session."""
    return bool(_local)


def event_publish_local(*, session_id: int, event: Event) -> None:
    """To this process's sockets only, from the event loop or any thread."""
    for socket in _local.get(session_id, ()):
        socket.push(event)


def _envelope(event: Event) -> dict[str, Any]:
    # `type` routes to the consumer's handler; the contract event rides inside untouched.
    return {"type": "chat.event", "event": event, "origin": ORIGIN}


def event_publish_now(*, session_id: int, event: Event) -> None:
    """Publish from sync code. A broken channel layer must never fail a stored message."""
    event_publish_local(session_id=session_id, event=event)
    layer = get_channel_layer()
    if not layer_is_shared(layer):
        return
    try:
        group_send_from_sync(layer, session_group(session_id), _envelope(event))
    except Exception:
        layer_failure_log("chat_event_publish_failed", session=session_id, type=event.get("type"))


# The sends group_send_from_sync saw through: the event loop keeps only weak references.
_sending: set[asyncio.Task[None]] = set()
# How long a send whose caller was cancelled is still waited for (see below).
GROUP_SEND_FINISH_SECONDS = 5.0


def group_send_from_sync(layer: Any, group: str, message: dict[str, Any]) -> None:
    """`layer.group_send` from sync code (a view's thread, an on_commit callback), finished
    even when the request that runs the code is cancelled (its client left). asgiref hands a
    cancelled request's cancellation to the task its async_to_sync made: the send stopped
    half-way and CancelledError, no Exception, came out of the view's store, so a send whose
    client left as its user message was announced never started its reply. The send runs in
    a task of its own, and a cancelled caller waits for it still (asgiref cancels once), up to
    GROUP_SEND_FINISH_SECONDS: the thread's next publish must not overtake it (Redis does not
    order concurrent group_sends). Raises what the send raises, or TimeoutError."""
    sending: list[asyncio.Task[None]] = []

    async def send() -> None:
        task = asyncio.ensure_future(layer.group_send(group, message))
        sending.append(task)
        _sending.add(task)
        task.add_done_callback(_sending.discard)
        await asyncio.shield(task)

    try:
        async_to_sync(send)()
    except asyncio.CancelledError:
        logger.info("chat_group_send_caller_cancelled group=%s", group)
        async_to_sync(_sent_within)(sending[0])


async def _sent_within(task: asyncio.Task[None]) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(task), GROUP_SEND_FINISH_SECONDS)
    except asyncio.CancelledError:
        if not task.cancelled():
            raise
        # The send itself was cancelled (the loop is stopping): nothing more to wait for.


def event_publish_on_commit(*, session_id: int, event: Event) -> None:
    transaction.on_commit(lambda: event_publish_now(session_id=session_id, event=event))


async def event_publish_async(
    *, session_id: int, event: Event, local: bool = True, remote: bool = True
) -> None:
    """Publish from async code: to this process's sockets (`local`) and through the shared
    layer to the other processes' (`remote`)."""
    if local:
        event_publish_local(session_id=session_id, event=event)
    if not remote:
        return
    layer = get_channel_layer()
    if not layer_is_shared(layer):
        return
    try:
        await layer.group_send(session_group(session_id), _envelope(event))
    except Exception:
        layer_failure_log("chat_event_publish_failed", session=session_id, type=event.get("type"))
