"""The turn service: what the adapters (REST, server-sent events, the WebSocket) call to run a
turn, from its checks to its reply. Each adapter only translates: its input into these calls,
their domain errors (chat/errors.py) and events into its own protocol.

    turn = await turn_open(...)          # checks, store, prepare (queueing behind a running reply)
    turn = turn_regenerate(...)          # or: the session's last reply, to generate again
    result = await reply_generate(turn=turn)             # REST JSON: wait for the reply
    async for event in reply_events(turn=turn): ...      # server-sent events: its events
    reply_spawn(turn=turn)                               # WebSocket: sockets get the events
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from django.conf import settings

from chat.context import context_budget_read
from chat.errors import NotFound, NotLastReply, ReplyInProgress
from chat.events import deltas_merged
from chat.models import ChatMessage, MessageRole, MessageStatus
from chat.queries import message_rows
from chat.selectors import session_for_user
from chat.shapes import message_payload
from chat.turn.checks import SendRequest, send_rate_check
from chat.turn.generate import ReplyResult, reply_generate, turn_prepare
from chat.turn.registry import Emit, live_payload
from chat.turn.rows import Turn, reply_restart, turn_store
from chat.workers import in_worker

logger = logging.getLogger("chat.realtime")

Event = dict[str, Any]
# How often a queued send retries while another reply of the session is generating.
QUEUE_POLL_SECONDS = 0.1


def _stored(*, send: SendRequest, abandoned: Callable[[], bool] | None = None) -> Turn | None:
    """Check and store the send's turn and prepare its reply, in one trip to the database.
    None while another reply of the session is generating and the send may queue."""
    try:
        turn = turn_store(send=send, abandoned=abandoned)
    except ReplyInProgress:
        if settings.CHAT_SEND_QUEUE_SECONDS <= 0:
            raise
        return None
    if turn.created:
        turn.prepared = turn_prepare(turn)
    return turn


def turn_attempt(
    *, user: Any, session_id: Any, content: Any, client_id: Any
) -> tuple[SendRequest, Turn | None]:
    """A send's first attempt (sync: one trip to the database): the rate, then the checks, the
    store and the prepare. The turn is None while another reply of the session is generating:
    then `turn_queue` waits for its turn. Raises Throttled, NotFound, InvalidInput,
    MessageTooLarge, and ReplyInProgress when the send may not queue."""
    send_rate_check(user=user)
    send = SendRequest(user=user, session_id=session_id, content=content, client_id=client_id)
    return send, _stored(send=send)


async def turn_queue(*, send: SendRequest, abandoned: Callable[[], bool] | None = None) -> Turn:
    """Wait, without holding a thread, until the session's running reply ends, up to
    CHAT_SEND_QUEUE_SECONDS (a queue of one), then store the turn; or raise ReplyInProgress.
    `abandoned` is asked before each try: when it says so (the login of the socket that sent
    it ended meanwhile, chat/consumers.py) the send is given up, NotFound, nothing stored."""
    deadline = time.monotonic() + settings.CHAT_SEND_QUEUE_SECONDS
    while True:
        await asyncio.sleep(QUEUE_POLL_SECONDS)
        if abandoned is not None and abandoned():
            raise NotFound()
        # Checked again: memory may have changed, the session gone, while this send waited.
        turn = await in_worker(_stored)(send=send, abandoned=abandoned)
        if turn is not None:
            return turn
        if time.monotonic() >= deadline:
            raise ReplyInProgress(
                "Another reply is still being generated in this session; try again when it "
                "finishes, or cancel it."
            )


async def turn_open(
    *,
    user: Any,
    session_id: Any,
    content: Any,
    client_id: Any,
    abandoned: Callable[[], bool] | None = None,
) -> Turn:
    """`turn_attempt` in a worker thread, then `turn_queue` if the session is busy: a send's
    turn, stored (the user message and a `streaming` reply row) and prepared, or what the
    first send of a repeated client_id stored (`created` False)."""
    send, turn = await in_worker(turn_attempt)(
        user=user, session_id=session_id, content=content, client_id=client_id
    )
    return turn if turn is not None else await turn_queue(send=send, abandoned=abandoned)


def turn_regenerate(*, user: Any, session_id: Any, message_id: int | None = None) -> Turn:
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
    )
    turn.prepared = turn_prepare(turn)
    return turn


# Strong references to replies started here: the event loop keeps only weak ones, and whoever
# asked (a socket, an HTTP response) must not own them.
_tasks: set[asyncio.Task[Any]] = set()


def reply_spawn(*, turn: Turn, emit: Emit | None = None) -> asyncio.Task[ReplyResult]:
    """Generate the turn's reply in a task of its own, which outlives the caller."""
    task = asyncio.ensure_future(reply_generate(turn=turn, emit=emit))
    _tasks.add(task)
    task.add_done_callback(_task_finished)
    return task


def _task_finished(task: asyncio.Task[Any]) -> None:
    _tasks.discard(task)
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.error("chat_reply_task_failed", exc_info=exc)


async def replies_wait(*, timeout: float = 30.0) -> None:
    """Wait until the replies started on this event loop have finished, after-reply work
    included. For a loop about to close (tests serve each streamed response on a loop of its
    own): a server's loop outlives its replies, and a reply cancelled at loop shutdown
    instead of finishing was seen to hang there on PostgreSQL + Redis."""
    loop = asyncio.get_running_loop()
    mine = [task for task in _tasks if task.get_loop() is loop]
    if mine:
        await asyncio.wait(mine, timeout=timeout)


async def reply_events(*, turn: Turn) -> AsyncIterator[Event]:
    """The events of the turn's reply as it is generated, ending with `done`, for one
    subscriber (a server-sent-events response). If the subscriber goes away, the reply goes
    on and is stored."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    task = reply_spawn(turn=turn, emit=queue.put_nowait)
    while True:
        getter = asyncio.ensure_future(queue.get())
        done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
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


def _repeat_events(turn: Turn) -> list[Event]:
    events: list[Event] = []
    if turn.user_message is not None:
        events.append({"type": "message", "message": message_payload(turn.user_message)})
    reply = turn.reply
    if reply is None:
        return events
    if reply.status == MessageStatus.STREAMING:
        # Still generating: the partial now; the rest reaches the session's sockets.
        events.append({"type": "message", "message": live_payload(message=reply)})
        return events
    events.append(
        {
            "type": "done",
            "message": message_payload(reply),
            "context_budget": context_budget_read(session_id=turn.session.pk),
        }
    )
    return events


async def turn_repeat_events(*, turn: Turn) -> list[Event]:
    """A send whose client_id was seen before: what the first one stored, for that sender."""
    events: list[Event] = await in_worker(_repeat_events)(turn)
    return events
