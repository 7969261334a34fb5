"""The replies this process is generating, one per session at most, and how their events leave.

A reply is registered for as long as it runs (`generation_tracked`). Through its `Generation`:
- events are published (`publish`): at once to this process's sockets and to the reply's own
  subscriber (a server-sent-events response), and in order, through a task of the generation's
  own, to the sockets of other processes (the channel layer);
- a `cancel` from a socket of any process reaches the task running it;
- a socket that (re)connects gets the reply's text so far, fresher than the last progress save.

This module sits below the generation (chat/turn/generate.py) and never calls back up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from channels.layers import get_channel_layer

from chat.errors import CancelFailed, NothingToCancel
from chat.events import (
    ORIGIN,
    deltas_merged,
    event_publish_async,
    event_publish_local,
    layer_failure_log,
    layer_is_shared,
)
from chat.models import ChatMessage, MessageStatus
from chat.shapes import Event, delta_event, done_event, message_event, message_payload
from chat.workers import in_worker

logger = logging.getLogger("chat.realtime")
# How long a reply's control listener gets to read its stop message before it is cancelled.
LISTENER_STOP_SECONDS = 2.0

# Takes an event without waiting (a queue's put_nowait): it is called for every token.
Emit = Callable[[Event], None]


def control_group(session_id: int) -> str:
    """Control messages travel here, not in the session's event group: `chat.cancel` (to the
    generating process), `chat.generating` (to sockets of other processes) and `chat.watch`
    (their answer, or a socket that just connected). Rare messages, whatever the token rate."""
    return f"chat_control_{session_id}"


# How long after the first token is published the work held back for it starts: time for the
# subscribers to write the token out (a few turns of the event loop).
AFTER_FIRST_TOKEN_DELAY_SECONDS = 0.05


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@dataclass(slots=True, kw_only=True)
class Generation:
    session_id: int
    # The task running the model rounds (cancelling it stores the partial as `cancelled`). Set
    # by whoever starts it, before the generation is tracked.
    task: asyncio.Task[Any] | None = None
    # Subscribers besides the sockets: the reply's own (a server-sent-events response), and
    # those following it for a repeated send (chat/turn/follow.py).
    subscribers: list[Emit] = field(default_factory=list)
    # The channel layer reaches other processes (channels-redis).
    shared: bool = False
    # The live text per reply row (tool rounds may write several rows): what a reconnecting
    # socket is shown. The lists are the streams' own, growing as tokens arrive.
    parts: dict[int, list[str]] = field(default_factory=dict)
    current_message_id: int = 0
    # A socket of another process watches this session: deltas then go through the channel
    # layer too. Stays on until the reply ends.
    remote_watchers: bool = False
    listener: asyncio.Task[None] | None = None
    channel: str = ""
    # The reply as `done` announced it (a ReplyResult): stored and final.
    finished: Any = None
    # Events waiting for the channel layer, in publish order.
    _outbox: list[Event] = field(default_factory=list)
    _sender: asyncio.Task[None] | None = None
    # Work held back until the reply's first token (or its end) has gone out: a background
    # compaction's reads and summarising must not compete with it for the process's CPU.
    _after_first_token: list[Callable[[], Any]] | None = field(default_factory=list)

    def after_first_token(self, fn: Callable[[], Any]) -> None:
        """Run `fn` once the reply's first token (or its `done`) is published; now if it was."""
        if self._after_first_token is None:
            fn()
        else:
            self._after_first_token.append(fn)

    def first_token_passed(self, *, written_first: bool = False) -> None:
        """Release the held work. `written_first`: the token was only published; its
        subscribers write it on the next turns of the event loop, and a thread started now (a
        compaction) could take the GIL first (a 5 ms switch interval). So the work starts a
        moment after, when there is a loop to wait on."""
        pending, self._after_first_token = self._after_first_token, None
        loop = _running_loop() if written_first else None
        for fn in pending or ():
            if loop is None:
                fn()
            else:
                loop.call_later(AFTER_FIRST_TOKEN_DELAY_SECONDS, fn)

    def stream_started(self, *, message_id: int, parts: list[str]) -> None:
        self.parts[message_id] = parts
        self.current_message_id = message_id

    def publish(self, event: Event) -> None:
        """Deliver an event of this reply. This process's sockets and the reply's subscriber
        get it now, without a task switch (a streamed reply is an event per token per socket).
        Deltas cross to other processes only while one of them has a socket on the session:
        the text they carry is in `parts`, so the catch-up a watcher gets covers the ones not
        sent."""
        event_publish_local(session_id=self.session_id, event=event)
        for emit in self.subscribers:
            emit(event)
        if self._after_first_token is not None and event.get("type") in ("delta", "done"):
            self.first_token_passed(written_first=True)
        if self.shared and (self.remote_watchers or event.get("type") != "delta"):
            self._enqueue(event)

    def _enqueue(self, event: Event) -> None:
        self._outbox.append(event)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_queued())

    async def _send_queued(self) -> None:
        """Send what has queued for the layer, all of it each time round. When the process is
        saturated, tokens pile up between rounds and leave as one merged delta: the per-event
        cost of the layer is paid per batch, and throughput rises to meet demand instead of a
        backlog growing without bound."""
        while self._outbox:
            batch, self._outbox = self._outbox, []
            for event in deltas_merged(batch):
                await event_publish_async(session_id=self.session_id, event=event, local=False)

    async def drain(self) -> None:
        """Wait until every published event has left (before the reply is reported done)."""
        while self._sender is not None and not self._sender.done():
            await asyncio.shield(self._sender)

    def cancel(self) -> None:
        if self.task is not None:
            _cancel_task(self.task)

    def remote_watcher_seen(self) -> None:
        """A socket of another process (re)joined the session: from now on deltas cross
        processes, starting with the whole text so far (offset 0; sockets drop what they
        already hold)."""
        self.remote_watchers = True
        message_id = self.current_message_id
        text = "".join(self.parts.get(message_id, ()))
        if text:
            self._enqueue(delta_event(message_id=message_id, text=text, offset=0))


_running: dict[int, Generation] = {}


def generation_running(*, session_id: int) -> Generation | None:
    return _running.get(session_id)


def _cancel_task(task: asyncio.Task[Any]) -> None:
    # The REST JSON path runs replies through async_to_sync, possibly on another loop/thread.
    loop = task.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        task.cancel()
    else:
        loop.call_soon_threadsafe(task.cancel)


async def _listen(gen: Generation, layer: Any) -> None:
    while True:
        try:
            message = await layer.receive(gen.channel)
        except Exception:  # the layer is down: the reply goes on, remote cancels cannot reach
            layer_failure_log("chat_control_listen_lost", session=gen.session_id)
            return
        kind = message.get("type")
        if kind == "chat.stop":
            return
        if kind == "chat.cancel":
            logger.info("chat_reply_cancel_remote session=%s", gen.session_id)
            gen.cancel()
        elif kind == "chat.watch" and message.get("origin") != ORIGIN:
            gen.remote_watcher_seen()


# Sessions whose reply was asked to stop before it started: a socket's cancel right behind
# its own send, whose turn was still being stored (reply_cancel found nothing to stop, and the
# reply then ran to its end). The reply is cancelled as it registers. With when it was asked:
# a mark whose send started no reply must not stop a later one.
_cancel_ahead: dict[int, float] = {}
CANCEL_AHEAD_SECONDS = 5.0


def reply_cancel_ahead(*, session_id: int, asked: bool = True) -> None:
    """Stop the session's next reply of this process as soon as it starts (`asked`), or
    forget that (the send it was for started none)."""
    if asked:
        _cancel_ahead[session_id] = time.monotonic()
    else:
        _cancel_ahead.pop(session_id, None)


@contextlib.asynccontextmanager
async def generation_tracked(*, gen: Generation) -> AsyncIterator[Generation]:
    """Register a running reply (its task already started) for the time of the `async with`
    block."""
    session_id = gen.session_id
    layer = get_channel_layer()
    # Both before the first await, so a cancel can never slip in unseen, and the task (which
    # first runs at that await) publishes knowing where to.
    gen.shared = layer_is_shared(layer)
    _running[session_id] = gen
    asked = _cancel_ahead.pop(session_id, None)
    if asked is not None and time.monotonic() - asked < CANCEL_AHEAD_SECONDS:
        logger.info("chat_reply_cancel_ahead session=%s", session_id)
        gen.cancel()
    try:
        if gen.shared:
            try:
                # The default prefix matters: channels-redis keeps one receive lock per process
                # and pops one Redis key per prefix; another prefix would hold the lock while
                # the sockets' messages wait on the default key.
                gen.channel = await layer.new_channel()
                await layer.group_add(control_group(session_id), gen.channel)
                gen.listener = asyncio.ensure_future(_listen(gen, layer))
                # Sockets of other processes already on the session answer with chat.watch.
                await layer.group_send(
                    control_group(session_id), {"type": "chat.generating", "origin": ORIGIN}
                )
            except Exception:
                # Without the layer the reply still runs; only remote cancels cannot reach it.
                layer_failure_log("chat_control_listen_failed", session=session_id)
        yield gen
    finally:
        with contextlib.suppress(BaseException):
            await asyncio.shield(gen.drain())
        if _running.get(session_id) is gen:
            del _running[session_id]
        if gen.listener is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(_listener_stop(gen, layer))
            with contextlib.suppress(BaseException):
                await asyncio.shield(_unlisten(gen, layer))


async def _listener_stop(gen: Generation, layer: Any) -> None:
    """End the listener with a message of its own rather than cancel(): a channels-redis
    receive cancelled mid-read (BZPOPMIN, redis-py 8) was seen to stay 'cancelling' for good,
    reading on, which hung the test loops that closed over it and would leak a Redis poller
    per reply on a server. Cancelled only when the message does not get through in time."""
    listener = gen.listener
    if listener is None or listener.done():
        return
    try:
        await layer.send(gen.channel, {"type": "chat.stop"})
        await asyncio.wait({listener}, timeout=LISTENER_STOP_SECONDS)
    finally:
        if not listener.done():
            listener.cancel()


async def _unlisten(gen: Generation, layer: Any) -> None:
    try:
        await layer.group_discard(control_group(gen.session_id), gen.channel)
    except Exception:
        layer_failure_log("chat_control_unlisten_failed", session=gen.session_id)


# --- what sockets ask of a running reply -------------------------------------------------------


def streaming_reply(*, session_id: int) -> ChatMessage | None:
    """The session's reply being generated now, in any process (a fresh `streaming` row)."""
    return ChatMessage.objects.filter(session_id=session_id).replies_live().order_by("-id").first()


def live_payload(*, message: ChatMessage) -> dict[str, Any]:
    """The stored reply row, with the live text when this process is generating it."""
    payload = message_payload(message)
    gen = _running.get(message.session_id)
    if gen is not None and message.pk in gen.parts:
        payload["content"] = "".join(gen.parts[message.pk])
    return payload


async def reply_resume(*, session_id: int) -> Event | None:
    """For a socket that connects: the reply being generated right now, if any, as a `message`
    event carrying the partial text, so the client can keep appending the deltas that follow."""
    message = await in_worker(streaming_reply)(session_id=session_id)
    if message is None:
        return None
    return message_event(message=live_payload(message=message))


def _rows_of(*, session_id: int, message_ids: list[int]) -> list[ChatMessage]:
    return list(
        ChatMessage.objects.filter(session_id=session_id, pk__in=message_ids).order_by("id")
    )


async def reply_ends(*, session_id: int, message_ids: list[int]) -> tuple[list[Event], set[int]]:
    """`done` for each of these replies of the session that is final now, and the ids of those
    still streaming: for a socket that may have missed a `done` (a Redis outage, a message the
    layer dropped). Without a budget: the next reply's `done` carries one."""
    if not message_ids:
        return [], set()
    rows = await in_worker(_rows_of)(session_id=session_id, message_ids=message_ids)
    ends = [
        done_event(message=message_payload(row), context_budget=None)
        for row in rows
        if row.status != MessageStatus.STREAMING
    ]
    return ends, {row.pk for row in rows if row.status == MessageStatus.STREAMING}


async def reply_watch(*, session_id: int) -> None:
    """A socket joined the session: tell a reply generating in another process to send its
    deltas through the layer (and the text so far). Nothing to do with one process."""
    layer = get_channel_layer()
    if not layer_is_shared(layer):
        return
    try:
        await layer.group_send(control_group(session_id), {"type": "chat.watch", "origin": ORIGIN})
    except Exception:
        layer_failure_log("chat_watch_publish_failed", session=session_id)


async def reply_cancel(*, session_id: int) -> None:
    """Stop the session's running reply wherever it runs. The reply's own task then stores the
    partial as `cancelled` and publishes `done`. Raises NothingToCancel, or CancelFailed when
    the cancel could not reach another process."""
    gen = _running.get(session_id)
    if gen is not None:
        gen.cancel()
        return
    if await in_worker(streaming_reply)(session_id=session_id) is None:
        raise NothingToCancel("No reply is being generated.")
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(control_group(session_id), {"type": "chat.cancel"})
    except Exception as exc:
        layer_failure_log("chat_cancel_publish_failed", session=session_id)
        raise CancelFailed("The cancel could not be sent.") from exc
