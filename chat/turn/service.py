"""The turn service: the one owner of a turn, from its checks to its reply, whichever adapter it
came through. Each adapter gets a `TurnRun` and only renders it: REST JSON awaits
`run.result()`, server-sent events iterate `run.events()`, a WebSocket sends `run.own` to its
client and calls `run.start()` (the session's sockets get the reply's events through its group).

    run = turn_send(...)                 # sync: rate, checks, store, prepare (one database trip)
    await run.ready(stream=...)          # only when `run.queued`: wait for the running reply,
                                         # then store the turn and start its reply
    run = turn_regenerate(...)           # or: the session's last reply, generated again

Queueing, the idempotent repeat (also of a reply still streaming, in any process), generation
and the finish are the run's business; the domain errors (chat/errors.py) are the adapters' to
translate.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from chat.context import context_budget_from_db
from chat.errors import ChatError, NotFound, NotLastReply, ReplyInProgress
from chat.events import deltas_merged
from chat.models import ChatMessage, MessageRole, MessageStatus
from chat.queries import message_rows
from chat.selectors import session_for_user
from chat.shapes import Event, done_event, message_event, message_payload
from chat.turn.checks import SendRequest, send_rate_check
from chat.turn.follow import reply_follow
from chat.turn.generate import ReplyResult, reply_generate, turn_prepare
from chat.turn.registry import Emit, live_payload
from chat.turn.replies import reply_restart
from chat.turn.rows import Turn, turn_store
from chat.workers import foreground_enter, foreground_exit, in_worker

logger = logging.getLogger("chat.realtime")

# How often a queued send retries while another reply of the session is generating.
QUEUE_POLL_SECONDS = 0.1


@dataclass(slots=True, frozen=True)
class TurnResult:
    """A turn as a caller that waited for all of it sees it (the REST JSON body)."""

    user_message: dict[str, Any] | None
    assistant_message: dict[str, Any] | None
    context_budget: dict[str, Any] | None


@dataclass(slots=True, kw_only=True, eq=False)
class TurnRun:
    """One send (or regenerate) as the turn service hands it to an adapter."""

    # Set while the send waits for the session's running reply (`queued`).
    send: SendRequest | None = None
    turn: Turn | None = None
    # For this caller alone: what a repeated client_id's first send stored.
    own: list[Event] = field(default_factory=list)
    # Already published to the session's sockets (a new send's user message): a caller that is
    # not one of them (server-sent events) gets these first.
    announced: list[Event] = field(default_factory=list)
    # A repeat whose reply still streams: (its first row's id, characters already in `own`).
    follows: tuple[int, int] | None = None
    _task: asyncio.Task[ReplyResult] | None = None
    # The reply's events for the one caller that streams them (_reply_events), from its start.
    _stream: asyncio.Queue[Event] | None = None

    @property
    def queued(self) -> bool:
        return self.turn is None

    async def ready(self, *, stream: bool, abandoned: Callable[[], bool] | None = None) -> None:
        """A queued send: wait, without holding a thread, until the session's running reply
        ends, up to CHAT_SEND_QUEUE_SECONDS (a queue of one), then store the turn and start its
        reply (`start(stream=)`); or raise ReplyInProgress. A send that did not queue returns
        at once (its caller starts it). `abandoned` is asked before each try and under the
        store's lock: when it says so (the login of the socket that sent it ended meanwhile)
        the send is given up, NotFound, nothing stored."""
        if self.send is None:
            return
        deadline = time.monotonic() + settings.CHAT_SEND_QUEUE_SECONDS
        while True:
            await asyncio.sleep(QUEUE_POLL_SECONDS)
            if abandoned is not None and abandoned():
                raise NotFound()
            # Checked again: memory may have changed, the session gone, while this send waited.
            store = asyncio.ensure_future(
                in_worker(_run_store)(send=self.send, abandoned=abandoned)
            )
            # A caller cancelled while its worker stores (an HTTP client that left) does not
            # stop the store: the turn it stores still gets its reply, or its empty
            # `streaming` row would keep the session busy until it counted as orphaned.
            store.add_done_callback(functools.partial(self._stored, stream=stream))
            _tasks.add(store)
            store.add_done_callback(_tasks.discard)
            try:
                await asyncio.shield(store)
            except asyncio.CancelledError:
                # No one is left to be told of a store that fails now (the database gone).
                store.add_done_callback(_store_failure_log)
                raise
            if not self.queued:
                return
            if time.monotonic() >= deadline:
                raise ReplyInProgress(
                    "Another reply is still being generated in this session; try again when "
                    "it finishes, or cancel it."
                )

    def _stored(self, store: asyncio.Future[TurnRun | None], *, stream: bool) -> None:
        if store.cancelled() or store.exception() is not None:
            return
        stored = store.result()
        if stored is not None:
            self._take(stored)
            self.start(stream=stream)

    def _take(self, other: TurnRun) -> None:
        self.send, self.turn = None, other.turn
        self.own, self.announced, self.follows = other.own, other.announced, other.follows

    def start(self, *, stream: bool = False) -> asyncio.Task[ReplyResult] | None:
        """Generate a new turn's reply in a task of its own, which outlives the caller (a
        dropped socket, a gone HTTP client); the session's sockets get its events. `stream`:
        they are kept for `events()` too (a server-sent-events response). A repeat starts
        nothing: its first send's reply runs, or ran, already. On the event loop."""
        if self.turn is None:
            raise RuntimeError("a queued send is started once it is ready()")
        if not self.turn.created or self._task is not None:
            return self._task
        emit = self._stream_queue().put_nowait if stream else None
        self._task = reply_spawn(turn=self.turn, emit=emit)
        return self._task

    def start_soon(self, loop: asyncio.AbstractEventLoop, *, stream: bool) -> None:
        """`start` on `loop`, from the thread that stored a new turn: the reply starts
        whatever becomes of the HTTP response, as a WebSocket's does. Started when the
        response was first read (its body, or a JSON caller's wait), a reply whose client left
        while the view ran never started (Django cancels the response unread), and its empty
        `streaming` row kept the session busy until it counted as orphaned (its process's
        lease lapsed, or STALE_STREAMING_SECONDS while the process generated others). (Its
        model is called ~0.5 ms sooner after the payload is built; the first token reaches
        the client no sooner, the response's start now running beside it: bench ttft.)"""
        if self.turn is None or not self.turn.created:
            return
        if stream:
            self._stream_queue()  # made here, before any event can come
        try:
            loop.call_soon_threadsafe(functools.partial(self.start, stream=stream))
        except RuntimeError:  # the loop has closed (the server stops): nothing will read it
            logger.info("chat_reply_not_started session=%s loop_closed", self._session_id)

    def _stream_queue(self) -> asyncio.Queue[Event]:
        # Made on whichever thread asks first; used only on the loop (Python binds an asyncio
        # queue to a loop at its first wait, not when it is made).
        if self._stream is None:
            self._stream = asyncio.Queue()
        return self._stream

    async def events(self) -> AsyncIterator[Event]:
        """Everything a caller outside the session's sockets sees, ending with `done` (final
        status) or, for a repeat that found no reply, with the user message."""
        for event in (*self.announced, *self.own):
            yield event
        if self.follows is not None:
            reply_id, held = self.follows
            async for event in reply_follow(
                session_id=self._session_id, reply_id=reply_id, held=held
            ):
                yield event
        elif self.turn is not None and self.turn.created:
            async for event in _reply_events(self):
                yield event

    async def result(self) -> TurnResult:
        """The whole turn, once its reply is final."""
        assert self.turn is not None
        user = message_payload(self.turn.user_message) if self.turn.user_message else None
        if self.turn.created:
            task = self.start()
            assert task is not None
            # Shielded: a caller that stops waiting (a JSON client that disconnected) must not
            # cancel the reply, which outlives it like any other (awaiting a task directly
            # passes the cancellation on to it).
            reply = await asyncio.shield(task)
            return TurnResult(
                user_message=user,
                assistant_message=message_payload(reply.message),
                context_budget=reply.context_budget,
            )
        done: Event | None = None
        async for event in self.events():
            if event["type"] == "done":
                done = event
        if done is None:
            budget = await in_worker(context_budget_from_db)(session_id=self._session_id)
            return TurnResult(user_message=user, assistant_message=None, context_budget=budget)
        return TurnResult(
            user_message=user,
            assistant_message=done["message"],
            context_budget=done["context_budget"],
        )

    @property
    def _session_id(self) -> int:
        assert self.turn is not None
        return int(self.turn.session.pk)


def _run_of(turn: Turn) -> TurnRun:
    """The run of a stored turn, with what its caller is told first. Sync: a repeat reads the
    state its first send left (and the budget) in the same trip as the store."""
    if turn.created:
        assert turn.user_message is not None
        turn.prepared = turn_prepare(turn)
        return TurnRun(
            turn=turn, announced=[message_event(message=message_payload(turn.user_message))]
        )
    run = TurnRun(turn=turn)
    if turn.user_message is not None:
        run.own.append(message_event(message=message_payload(turn.user_message)))
    reply = turn.reply
    if reply is None:
        return run
    if reply.status == MessageStatus.STREAMING:
        # Still generating, here or in another process: the partial now, then the rest.
        partial = live_payload(message=reply)
        run.own.append(message_event(message=partial))
        run.follows = (reply.pk, len(partial["content"]))
        return run
    budget = context_budget_from_db(session_id=turn.session.pk)
    run.own.append(done_event(message=message_payload(reply), context_budget=budget))
    return run


def _run_store(*, send: SendRequest, abandoned: Callable[[], bool] | None = None) -> TurnRun | None:
    """Check and store the send's turn and prepare its reply, in one trip to the database.
    None while another reply of the session is generating and the send may queue.

    From its checks to its reply's first token, a new turn is on its way: this process's
    background work gives way to it (chat/workers.py)."""
    key = foreground_enter()
    try:
        try:
            turn = turn_store(send=send, abandoned=abandoned)
        except ReplyInProgress:
            if settings.CHAT_SEND_QUEUE_SECONDS <= 0:
                raise
            foreground_exit(key)
            return None
        run = _run_of(turn)
    except BaseException:
        foreground_exit(key)
        raise
    if run.turn is not None and run.turn.created:
        run.turn.foreground = key
    else:
        foreground_exit(key)  # a repeat: its first send's reply runs, or ran, already
    return run


def turn_send(
    *, user: Any, session_id: Any, content: Any, client_id: Any, login_hash: str | None = None
) -> TurnRun:
    """A send (sync: one trip to the database): the rate, then the checks, the store and the
    prepare. While another reply of the session is generating, the run is `queued` and
    `ready()` waits for its turn. Raises Throttled, NotFound, InvalidInput, MessageTooLarge,
    LoginEnded (a socket's `login_hash` no longer current), and ReplyInProgress when the send
    may not queue."""
    send_rate_check(user=user)
    send = SendRequest(
        user=user,
        session_id=session_id,
        content=content,
        client_id=client_id,
        login_hash=login_hash,
    )
    run = _run_store(send=send)
    return run if run is not None else TurnRun(send=send)


async def turn_open(
    *,
    user: Any,
    session_id: Any,
    content: Any,
    client_id: Any,
    abandoned: Callable[[], bool] | None = None,
    login_hash: str | None = None,
) -> TurnRun:
    """`turn_send` in a worker thread, then its wait in the queue: for callers on the event
    loop (the WebSocket)."""
    run: TurnRun = await in_worker(turn_send)(
        user=user,
        session_id=session_id,
        content=content,
        client_id=client_id,
        login_hash=login_hash,
    )
    await run.ready(stream=False, abandoned=abandoned)
    return run


def turn_regenerate(*, user: Any, session_id: Any, message_id: int | None = None) -> TurnRun:
    """Generate the session's last reply again (also the retry of a failed or cancelled one).
    Raises NotFound, NotLastReply (`message_id` given and not the last reply, or the session
    does not end with a reply), ReplyInProgress."""
    send_rate_check(user=user)
    session = session_for_user(user=user, session_id=session_id)
    messages = ChatMessage.objects.filter(session_id=session.pk)
    last = message_rows(messages, order="-id", limit=1).first()
    if last is None or last.role != MessageRole.ASSISTANT or (message_id and message_id != last.pk):
        raise NotLastReply("Only the last reply of a session can be regenerated.")
    if last.status == MessageStatus.STREAMING:
        raise ReplyInProgress("That reply is still being generated.")
    asked = messages.filter(role=MessageRole.USER, id__lt=last.pk)
    user_message = message_rows(asked, order="-id", limit=1).first()
    reply = reply_restart(session=session, reply=last)
    turn = Turn(
        session=session,
        user_message=user_message,
        reply=reply,
        query=user_message.content if user_message else "",
        foreground=foreground_enter(),
    )
    try:
        turn.prepared = turn_prepare(turn)
    except BaseException:
        foreground_exit(turn.foreground)
        raise
    return TurnRun(turn=turn)


# Strong references to replies started here: the event loop keeps only weak ones, and whoever
# asked (a socket, an HTTP response) must not own them.
_tasks: set[asyncio.Task[Any]] = set()


def reply_spawn(*, turn: Turn, emit: Emit | None = None) -> asyncio.Task[ReplyResult]:
    """Generate the turn's reply in a task of its own, which outlives the caller."""
    task = asyncio.ensure_future(reply_generate(turn=turn, emit=emit))
    _tasks.add(task)
    task.add_done_callback(_task_finished)
    return task


def _store_failure_log(store: asyncio.Future[Any]) -> None:
    if store.cancelled() or (exc := store.exception()) is None:
        return
    if isinstance(exc, ChatError):  # refused as it would have been with the caller there
        logger.info("chat_send_not_stored caller_left error=%s", type(exc).__name__)
    else:
        logger.warning("chat_send_not_stored caller_left", exc_info=exc)


def _task_finished(task: asyncio.Task[Any]) -> None:
    _tasks.discard(task)
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.error("chat_reply_task_failed", exc_info=exc)


async def _reply_events(run: TurnRun) -> AsyncIterator[Event]:
    """The events of a new turn's reply as it is generated, ending with `done`, for one
    subscriber (a server-sent-events response). If the subscriber goes away, the reply goes
    on and is stored."""
    # Started already by start_soon (its events in the same queue), or now.
    task = run.start(stream=True)
    queue = run._stream_queue()
    assert task is not None
    while True:
        getter = asyncio.ensure_future(queue.get())
        try:
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Also when the subscriber is cancelled (gone): no get left pending on the queue.
            if not getter.done():
                getter.cancel()
        # Everything that has queued, deltas merged: a subscriber that fell behind catches up
        # in a few writes instead of one per token (as the sockets do, chat/events.py).
        batch = [getter.result()] if getter in done else []
        while not queue.empty():
            batch.append(queue.get_nowait())
        for event in deltas_merged(batch):
            yield event
            if event["type"] == "done":
                return
        if getter not in done:
            return
