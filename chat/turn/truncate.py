"""Edit and resend's truncation, and a session's deletion, while a reply may be generating, for
every adapter.

Deleting the rows of a reply that is still streaming pulls its row from under it: its final
write finds nothing, no `done` or `error` reaches anyone, and pages keep a bubble stuck on
"Generating…". So a running reply is stopped first, through the same cancel a socket sends
(it reaches the reply in whatever process runs it): the reply stores its partial as
`cancelled` and publishes `done` as for any cancel, and only then are the rows deleted, by
`message_truncate`, which refuses while a live reply row remains.

Sync: the REST view runs in a thread; the wait is the cancel's own latency (well under a
second), and only when a reply was running."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync

from chat.errors import CancelFailed, NotFound, NothingToCancel, ReplyInProgress
from chat.models import ChatMessage, ChatSession
from chat.selectors import session_for_user, user_live_session_ids
from chat.services.sessions import TruncateResult, message_truncate, session_delete
from chat.turn.registry import generation_running, reply_cancel, streaming_reply

logger = logging.getLogger("chat.realtime")

# How long a truncation waits for a running reply to stop (a cancel lands within ~200 ms in
# one process; across processes it also crosses the channel layer).
CANCEL_WAIT_SECONDS = 5.0
POLL_SECONDS = 0.02


@dataclass(frozen=True, slots=True)
class Truncated:
    result: TruncateResult
    # The reply stopped so its rows could go (its `done`, status `cancelled`, was published),
    # or None when no reply was running.
    cancelled_reply_id: int | None


def _reply_still_running(session_id: int) -> int | None:
    """The id of a reply of the session still to settle: a live `streaming` row (any process),
    or this process's generation that has not yet announced its `done`. 0 when only the
    latter is known."""
    row = streaming_reply(session_id=session_id)
    if row is not None:
        return row.pk
    gen = generation_running(session_id=session_id)
    if gen is not None and gen.finished is None:
        return gen.current_message_id or 0
    return None


def _cancel_once(session_id: int, running: int, asked: set[int], *, why: str) -> None:
    """Ask the session's running reply to stop, once per reply: a second cancel could reach the
    next reply a queued send starts. `why`: "truncate" or "session_delete", for the log."""
    if running in asked:
        return
    asked.add(running)
    logger.info("chat_%s_cancel session=%s reply=%s", why, session_id, running)
    try:
        async_to_sync(reply_cancel)(session_id=session_id)
    except NothingToCancel:
        pass  # it finished by itself meanwhile
    except CancelFailed:
        # The channel layer is down: the reply may still stop by itself; the wait decides.
        logger.warning("chat_%s_cancel_failed session=%s", why, session_id)


def turn_truncate(*, user: Any, session_id: Any, message_id: int) -> Truncated:
    """Delete `message_id` and everything after it, stopping the session's running reply
    first. Raises NotFound (someone else's session, a message not in it: nothing is cancelled
    or deleted), ReplyInProgress when the reply did not stop in time (nothing deleted)."""
    session = session_for_user(user=user, session_id=session_id)
    if not ChatMessage.objects.filter(session_id=session.pk, pk=message_id).exists():
        raise NotFound()
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    cancelled: int | None = None
    asked: set[int] = set()
    while True:
        running = _reply_still_running(session.pk)
        if running is None:
            try:
                result = message_truncate(
                    session=session, message_id=message_id, refuse_while_replying=True
                )
            except ReplyInProgress:
                pass  # a reply started between the look and the lock: stop that one too
            else:
                return Truncated(result=result, cancelled_reply_id=cancelled)
        else:
            if running and running not in asked:
                cancelled = running
            _cancel_once(session.pk, running, asked, why="truncate")
        if time.monotonic() >= deadline:
            raise ReplyInProgress(
                "The reply being generated could not be stopped; try again in a moment."
            )
        time.sleep(POLL_SECONDS)


def turn_session_delete(*, user: Any, session_id: Any) -> None:
    """Delete the user's session (NotFound for someone else's), stopping its running reply
    first (session_delete_live)."""
    session_delete_live(session=session_for_user(user=user, session_id=session_id))


def session_delete_live(*, session: ChatSession) -> None:
    """Delete a session that may have a reply generating, stopping the reply first, as a
    truncation does (session_replies_stop): the owner's DELETE and the admin's action both
    come here."""
    session_replies_stop(session_id=session.pk)
    session_delete(session=session)


def session_replies_stop(*, session_id: int) -> None:
    """Before a session is deleted: stop its running reply, in whatever process runs it, and
    wait up to CANCEL_WAIT_SECONDS for it to settle. Else the reply went on to its end under a
    chat nobody can see any more: spending the operator's model, holding one of the user's
    concurrent replies, and failing its final write with ERRORs. One that does not stop in
    time is deleted under all the same (the chat was asked to go): its final write finds its
    row gone and ends quietly (chat/turn/failures.py). Outside any transaction: on SQLite its
    snapshot would never see the reply's row settle."""
    deadline = time.monotonic() + CANCEL_WAIT_SECONDS
    asked: set[int] = set()
    while (running := _reply_still_running(session_id)) is not None:
        _cancel_once(session_id, running, asked, why="session_delete")
        if time.monotonic() >= deadline:
            logger.warning("chat_session_delete_reply_running session=%s", session_id)
            break
        time.sleep(POLL_SECONDS)


def user_replies_stop(*, user_id: int) -> None:
    """Before a user is deleted (the admin): session_replies_stop for each of their sessions
    with a reply generating."""
    for session_id in user_live_session_ids(user_id=user_id):
        session_replies_stop(session_id=session_id)
