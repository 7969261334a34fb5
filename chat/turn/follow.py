"""Following a reply that is already being generated, for a caller that is not one of the
session's sockets: a server-sent-events response (or a REST JSON wait) for a repeated
client_id whose first send's reply still streams. The sockets need none of this: they are in
the session's group and get every event wherever the reply runs.

Two ways, one stream of events for the caller, ending with `done` in a final status:
- the reply runs in this process: subscribe to its generation (chat/turn/registry.py), after a
  catch-up delta from the text it holds, all on the event loop so no token falls in between;
- it runs in another process, or in none (the process died): read its row as the generating
  process saves it (every SAVE_EVERY_SECONDS), sending what grew as deltas, until the row is
  final. A row silent for STALE_STREAMING_SECONDS (chat.models) belongs to no live process:
  the sweep fails it, and that is the final status the caller gets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from chat.context import context_budget_from_db
from chat.models import ChatMessage, MessageRole, MessageStatus
from chat.shapes import Event, delta_event, done_event, error_event, message_payload
from chat.turn.registry import Generation, generation_running
from chat.turn.replies import streaming_sweep
from chat.workers import in_worker

# How often a reply generated elsewhere is read again: its process saves progress every 0.5 s.
FOLLOW_POLL_SECONDS = 0.25


async def reply_follow(*, session_id: int, reply_id: int, held: int) -> AsyncIterator[Event]:
    """The events of the turn whose first reply row is `reply_id`, from `held` characters of
    its text on (what the caller was already shown), ending with `done`."""
    gen = generation_running(session_id=session_id)
    if gen is not None and reply_id in gen.parts:
        async for event in _follow_here(gen, reply_id=reply_id, held=held):
            yield event
        return
    async for event in _follow_rows(session_id=session_id, reply_id=reply_id, held=held):
        yield event


async def _follow_here(gen: Generation, *, reply_id: int, held: int) -> AsyncIterator[Event]:
    queue: asyncio.Queue[Event] = asyncio.Queue()
    # No await from here to the subscription: the catch-up and the live deltas meet exactly.
    if gen.finished is not None:
        yield done_event(
            message=message_payload(gen.finished.message),
            context_budget=gen.finished.context_budget,
        )
        return
    message_id = gen.current_message_id
    text = "".join(gen.parts.get(message_id, ()))
    start = held if message_id == reply_id else 0
    gen.subscribers.append(queue.put_nowait)
    try:
        if len(text) > start:
            yield delta_event(message_id=message_id, text=text[start:], offset=start)
        while True:
            event = await queue.get()
            yield event
            if event["type"] == "done":
                return
    finally:
        gen.subscribers.remove(queue.put_nowait)


def _turn_rows(*, session_id: int, reply_id: int) -> tuple[ChatMessage | None, bool]:
    """The turn's newest assistant row (tool rounds write several), and whether it is final.
    A row with tool calls is final only once no newer row follows it for the loop's answer;
    until then the loop is between rounds."""
    newest = (
        ChatMessage.objects.filter(
            session_id=session_id, role=MessageRole.ASSISTANT, id__gte=reply_id
        )
        .order_by("-id")
        .first()
    )
    if newest is None:
        return None, True  # the turn was deleted (truncated) meanwhile
    if newest.status == MessageStatus.STREAMING:
        if streaming_sweep(session_id=session_id):
            newest.refresh_from_db()
        return newest, newest.status != MessageStatus.STREAMING
    return newest, not newest.tool_calls or newest.status != MessageStatus.COMPLETE


def _done(message: ChatMessage) -> Event:
    return done_event(
        message=message_payload(message),
        context_budget=context_budget_from_db(session_id=message.session_id),
    )


async def _follow_rows(*, session_id: int, reply_id: int, held: int) -> AsyncIterator[Event]:
    shown = {reply_id: held}
    while True:
        row, final = await in_worker(_turn_rows)(session_id=session_id, reply_id=reply_id)
        if row is None:
            yield error_event(code="not_found", message="This reply was deleted.")
            return
        # What grew since the last read, also the last words of a row now final: the deltas
        # alone build the reply, as a live generation's do.
        start = shown.get(row.pk, 0)
        if len(row.content) > start:
            yield delta_event(message_id=row.pk, text=row.content[start:], offset=start)
            shown[row.pk] = len(row.content)
        if final:
            yield await in_worker(_done)(row)
            return
        await asyncio.sleep(FOLLOW_POLL_SECONDS)
