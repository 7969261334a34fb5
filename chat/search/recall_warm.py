"""Recall's window read when a chat is opened, not at the first send that needs it.

A send of a long chat matches its message against the archive's newest rows, which this
process keeps between sends (chat/search/archive_window.py). A send that finds none kept reads
them before its first token: the first send to a session just imported or made by seed_demo,
the first to any session after this process started, after an admin edit or a truncation, or
after the kept entry's ENTRY_SECONDS. In process, on bench ttft's imported session, that read
(1,000 rows fetched and case-folded, each word of the message scanned over them) made the
payload build 9.3 ms against 4.3 with the window kept (4.7 read ahead with its word list). A
user opens a chat before writing in it: the chat page, the history's newest page and the
session's socket each start the read in the background (chat/workers.py `warm_submit`: its
own thread, one job per session, a bounded queue), and the send finds the window kept, its
bound moved by a message or two (read in one short statement).

Nothing here is on a request's way: the trigger checks what is in memory and counts the user's
`recall_warm` rate (THROTTLE_RECALL_WARM); the job runs on the warming thread, gives way to
sends of its process on their way to their first token (background_yield), and does nothing
for a chat with no archive or under the seed's strategy. Its reads are bounded as a send's:
the tail page (its prompt rendered as for an empty message: for a chat over its budget with no
summary, a send's own prompt may end the tail a row or two elsewhere; a bound moved forward is
read in one short statement, one moved back anew) and WINDOW_ROWS archived rows, whose words
it then lists (chat/search/window_words.py). Callers have checked the session's owner
(chat/selectors.py `session_for_user`); the job reads the session again by id and owner.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from django.conf import settings

from cadau.limits import limit_hit
from chat.context.compose import archive_bound_find
from chat.context.prompt import context_config_for
from chat.context.state import context_state_read
from chat.models import ChatSession
from chat.search.archive_window import (
    WINDOW_ROWS,
    archive_window_read,
    archive_window_ready,
    archive_window_words_build,
)
from chat.workers import background_yield, warm_submit, warm_waiting

logger = logging.getLogger("chat.search")

# A chat without a summary and fewer messages than this is left alone: the default budget holds
# all of it (no archive to recall from), and where it does not, its window is small and the
# send's own read cheap.
WARM_MIN_MESSAGES = 100
# Sessions a job found nothing to read for (all of it fits the payload, or the seed's strategy),
# with the state it found (their versions and message count): opened again unchanged, they are
# not read again. Bounded, least recently found out first.
NOTHING_KEPT_MAX = 1024
_nothing: OrderedDict[int, tuple[int, int, int]] = OrderedDict()
_nothing_lock = threading.Lock()


def _state(session: ChatSession) -> tuple[int, int, int]:
    return (session.messages_version, session.context_version, session.message_count)


def recall_window_warm_start(*, session: ChatSession) -> bool:
    """Have this process read, in the background, the archive window the session's next send
    will recall from; False when there is nothing to do (recall off or the seed's strategy, a
    short chat or one found with no archive, a window kept with its word list, a job of the
    session under way, the user's rate spent) or the warming queue is full. Reads nothing from
    the database (the rate is counted in the cache)."""
    if not settings.CHAT_CONTEXT_RECALL:
        return False
    if session.verbatim_since_message_id is None and session.message_count < WARM_MIN_MESSAGES:
        return False
    key = _job_key(session.pk)
    with _nothing_lock:
        found_nothing = _nothing.get(session.pk) == _state(session)
    if (
        found_nothing
        or warm_waiting(key)
        or context_config_for(session=session).strategy != "cadau"
        or archive_window_ready(
            owner_id=session.owner_id,
            session_id=session.pk,
            version=session.messages_version,
            below_id=session.verbatim_since_message_id,
        )
    ):
        return False
    # Each job reads up to WINDOW_ROWS rows and lists their words (10-30 ms): a user opening
    # chat after chat is counted, once per job started. Past the rate the chat opens as before.
    if limit_hit(scope="recall_warm", ident=f"user:{session.owner_id}") is not None:
        return False
    job = warm_submit(
        key,
        recall_window_warm,
        session_id=session.pk,
        owner_id=session.owner_id,
    )
    return job is not None


def recall_warm_forget() -> None:
    """Forget the sessions found with nothing to read (tests: SQLite gives a rolled-back test's
    ids to the next test again)."""
    with _nothing_lock:
        _nothing.clear()


def recall_window_read_later(
    *, session_id: int, owner_id: int, below_id: int, version: int, size: int
) -> None:
    """Read, in the background, the whole window a send recalled only the newest rows of (it
    found none kept: chat/search/archive_window.py `cold_rows`), at that send's bound and
    version: the next send's bound has moved by its own turn at most (a short read then). Not
    counted against the user's `recall_warm` rate: the send that asks is counted, and one job
    per session runs at a time. The job waits for the send's first token, and reads in steps
    that give way to later sends (background_yield)."""
    job = warm_submit(
        _job_key(session_id),
        _window_read,
        session_id=session_id,
        owner_id=owner_id,
        below_id=below_id,
        version=version,
        size=size,
    )
    if job is None and not warm_waiting(_job_key(session_id)):
        # The queue is full: the session's next send recalls from its newest rows again.
        logger.info("chat_recall_window_read_dropped session=%s", session_id)


def _window_read(*, session_id: int, owner_id: int, below_id: int, version: int, size: int) -> None:
    background_yield()
    # Edited or truncated since the send asked (an edit-and-resend): its read is not wanted,
    # and the resend asks for its own.
    now = (
        ChatSession.objects.filter(pk=session_id, owner_id=owner_id)
        .values_list("messages_version", flat=True)
        .first()
    )
    if now != version:
        return
    _read_and_list(
        owner_id=owner_id, session_id=session_id, below_id=below_id, size=size, version=version
    )


def _job_key(session_id: int) -> tuple[str, int]:
    """One warming job per session, whoever asked for it (a chat opened, a cold send)."""
    return ("recall-window", session_id)


def _read_and_list(
    *, owner_id: int, session_id: int, below_id: int, size: int, version: int
) -> None:
    """The whole window, read in steps, and its word list."""
    archive_window_read(
        owner_id=owner_id,
        session_id=session_id,
        below_id=below_id,
        size=size,
        version=version,
        in_steps=True,
    )
    archive_window_words_build(owner_id=owner_id, session_id=session_id)


def recall_window_warm(*, session_id: int, owner_id: int) -> bool:
    """Read the archive window the session's next send will recall from, as that send's payload
    would bound it (its tail read as now); whether one was read."""
    background_yield()
    session = (
        ChatSession.objects.select_related("agent", "owner")
        .filter(pk=session_id, owner_id=owner_id)
        .first()
    )
    if session is None:
        return False
    state = context_state_read(session=session)
    below_id = archive_bound_find(state=state)
    if below_id is None or state.cfg.strategy != "cadau":  # the seed's loop recalls nothing
        with _nothing_lock:
            _nothing[session.pk] = _state(session)
            _nothing.move_to_end(session.pk)
            while len(_nothing) > NOTHING_KEPT_MAX:
                _nothing.popitem(last=False)
        return False
    _read_and_list(
        owner_id=owner_id,
        session_id=session_id,
        below_id=below_id,
        size=WINDOW_ROWS,
        version=session.messages_version,
    )
    return True
