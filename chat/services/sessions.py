"""Writes on sessions: create, rename, delete, and truncation (edit and resend).

Callers pass objects they already got through `session_for_user`, so ownership is settled
before anything here runs."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Subquery

from chat.context import context_reset
from chat.context.prompt import model_allowed
from chat.errors import InvalidInput, NotFound, ReplyInProgress
from chat.models import ChatMessage, ChatSession, ContextSnapshot, SnapshotOutcome
from chat.search.archive_window import archive_window_truncated
from chat.selectors import agent_for_user


def session_create(*, user: Any, title: str = "", agent_id: int | None = None) -> ChatSession:
    # agent_for_user: someone else's agent is a 404, exactly like a missing one.
    agent = agent_for_user(user=user, agent_id=agent_id) if agent_id is not None else None
    return ChatSession.objects.create(owner=user, agent=agent, title=title)


def session_update(*, session: ChatSession, title: str) -> ChatSession:
    session.title = title
    # Renaming is not activity: last_activity_at stays, so the list order does not jump.
    session.save(update_fields=["title", "updated_at"])
    return session


def session_model_set(*, session: ChatSession, model: str) -> ChatSession:
    """The model this chat's replies go to from the next send on; "" = the agent's or the
    server's. Only one the operator allows (LLM_ALLOWED_MODELS): a refusal changes nothing."""
    model = model.strip()
    if not model_allowed(model=model):
        allowed = ", ".join(settings.LLM_ALLOWED_MODELS) or "none"
        raise InvalidInput(
            f"model: {model!r} is not one this server allows (allowed: {allowed}; empty for "
            "the agent's or the server's default)",
            code="model_not_allowed",
        )
    session.model = model
    session.save(update_fields=["model", "updated_at"])
    return session


# Messages deleted a statement when a session goes. On SQLite each statement holds the whole
# database's write lock, and a message costs ~37 µs to delete with its search-index rows (a
# 100,000-message chat in one statement: 3.7 s during which every other user's send waited;
# in Django's collector, 6.7 s). 2,000 hold it ~75 ms; other writers get it in between.
SESSION_DELETE_CHUNK = 2000


def session_delete(*, session: ChatSession) -> None:
    """The session and all that belongs to it: its messages newest first, SESSION_DELETE_CHUNK
    a statement, then the session row, the database's ON DELETE CASCADE (cadau/dbconstraints.py)
    taking their vectors, its snapshots and its memory-flush records. Not Django's collector:
    a message's vector cascades from it, so the collector read every message id of the session
    into memory first and deleted them a hundred at a time, all in one transaction."""
    while _messages_delete_chunk(session_id=session.pk):
        pass
    _raw_delete(ChatSession.objects.filter(pk=session.pk))


def user_sessions_delete(*, user_id: int) -> None:
    """Every session of the user, as session_delete does one (before the user's own delete,
    whose collector would otherwise read all their messages' ids)."""
    for session in ChatSession.objects.filter(owner_id=user_id).only("pk"):
        session_delete(session=session)


def _messages_delete_chunk(*, session_id: int) -> int:
    """Delete the session's newest SESSION_DELETE_CHUNK messages; how many went."""
    newest = ChatMessage.objects.filter(session_id=session_id).order_by("-id").values("id")
    chunk = ChatMessage.objects.filter(id__in=Subquery(newest[:SESSION_DELETE_CHUNK]))
    return _raw_delete(chunk)


def _raw_delete(queryset: Any) -> int:
    """DELETE the rows of `queryset` in one statement, children by the database's cascades;
    how many rows of its own model went. No model signals are sent: none are connected.

    `_raw_delete` is private to Django: it is what Django's own collector calls for a "fast
    delete", and the public `delete()` would run the collector, which reads every message id
    first (vectors cascade from messages). tests/test_db_on_delete.py checks what this relies
    on: every relation under a session cascades in the database, and none has a delete signal;
    a Django upgrade that renames it fails those tests, not a user's delete."""
    return int(queryset._raw_delete(queryset.db))


def sessions_messages_changed(*, session_ids: list[int]) -> None:
    """Messages of these sessions were edited or deleted outside a turn (the admin): move their
    messages_version, which tells what was read of them before from what is there now (recall's
    kept rows, chat/search/archive_window.py, in every process), and their context_version (a
    compaction in flight then does not commit a summary of the old text)."""
    ChatSession.objects.filter(pk__in=session_ids).update(
        context_version=F("context_version") + 1, messages_version=F("messages_version") + 1
    )


@dataclass(frozen=True, slots=True)
class TruncateResult:
    deleted: int
    summary_rewound: bool
    session: ChatSession  # the row as committed, for the caller's context_budget


def message_truncate(
    *, session: ChatSession, message_id: int, refuse_while_replying: bool = False
) -> TruncateResult:
    """Delete `message_id` and every later message of the session, in one transaction.

    If the cut falls before the verbatim anchor, the summary describes messages that no
    longer exist; the session is then rewound to the newest recorded state that covers only
    surviving messages (or to an empty summary), and the rewind is itself recorded.

    `refuse_while_replying`: refuse (ReplyInProgress, nothing deleted) while a reply of the
    session is live (chat.models reply_live_since); a reply's final write must never find its
    row gone (the turn service stops the reply first, chat/turn/truncate.py)."""
    with transaction.atomic():
        # The lock serialises us with the send path (it stores turns under it), so nobody
        # appends after, or starts a reply among, the messages we are deleting.
        locked = (
            ChatSession.objects.select_related("agent", "owner")
            .select_for_update(of=("self",))
            .get(pk=session.pk)
        )
        if not ChatMessage.objects.filter(session_id=locked.pk, pk=message_id).exists():
            raise NotFound()
        if (
            refuse_while_replying
            and ChatMessage.objects.filter(session_id=locked.pk).replies_live().exists()
        ):
            raise ReplyInProgress("A reply is being generated in this session; stop it first.")
        # One statement, their vectors by the database's cascade (as session_delete).
        deleted = _raw_delete(ChatMessage.objects.filter(session_id=locked.pk, id__gte=message_id))
        ChatSession.objects.filter(pk=locked.pk).counters_add(messages=-deleted)
        # Under the lock: the committed count, for the caller's budget.
        locked.message_count = max(0, locked.message_count - deleted)
        # Rows are gone: what recall kept of the archive is read again.
        locked.messages_version += 1
        fields = ["updated_at", "context_version", "messages_version"]

        anchor = locked.verbatim_since_message_id
        rewound = anchor is not None and message_id < anchor
        if rewound:
            _rewind_summary(session=locked, cut=message_id)
            fields += ["context_summary", "verbatim_since_message_id"]
        else:
            # Compaction does not take this lock: it reads the tail, summarises for seconds
            # without holding anything, and commits under compare-and-swap on the version. A
            # summarising call in flight may have been handed messages deleted here (at or
            # after the anchor, the summary itself survives): moving the version makes its
            # commit lose (a `conflict` snapshot, nothing changed), and the next compaction
            # summarises what is left. The rewind above moves it too.
            locked.context_version += 1
        locked.save(update_fields=fields)
        # The archive rows recall keeps in this process (all under the cut, unless the cut
        # rewound the summary) stay valid at the new version.
        transaction.on_commit(
            functools.partial(
                archive_window_truncated,
                owner_id=locked.owner_id,
                session_id=locked.pk,
                from_id=message_id,
                version=locked.messages_version - 1,
                moved_to=locked.messages_version,
            )
        )
    return TruncateResult(deleted=deleted, summary_rewound=rewound, session=locked)


def _rewind_summary(*, session: ChatSession, cut: int) -> None:
    """Restore the newest summary state that mentions no message with id >= cut.

    A state is a committed compaction, or an earlier rewind/reset (which recorded the state it
    produced). Walking newest-first and stopping at the first state that fits is what keeps a
    second truncation correct: a committed snapshot from *before* an earlier rewind may cover
    messages that rewind deleted, but the rewind's own record is newer and fits first."""
    state = (
        ContextSnapshot.objects.filter(session_id=session.pk)
        .filter(
            Q(outcome=SnapshotOutcome.RESET)
            | Q(outcome=SnapshotOutcome.REWOUND, summary_through_message_id__isnull=True)
            | Q(
                outcome__in=(SnapshotOutcome.COMMITTED, SnapshotOutcome.REWOUND),
                summary_through_message_id__lt=cut,
            )
        )
        .order_by("-id")
        .first()
    )
    if state is None or state.outcome == SnapshotOutcome.RESET or not state.summary:
        summary, through, anchor = "", None, None
    else:
        summary, through = state.summary, state.summary_through_message_id
        anchor = state.verbatim_since_message_id
        if anchor is None and through is not None:
            anchor = through + 1  # an anchor is a position: right after what is summarised
    before = session.context_summary
    session.context_summary = summary
    session.verbatim_since_message_id = anchor
    session.context_version += 1
    ContextSnapshot.objects.create(
        session=session,
        outcome=SnapshotOutcome.REWOUND,
        trigger="truncate",
        summary=summary,
        summary_through_message_id=through,
        verbatim_since_message_id=anchor,
        context_version=session.context_version,
        runes_before=len(before),
        runes_after=len(summary),
    )


def session_context_reset(*, session: ChatSession, by: str = "") -> None:
    """An operator clears the session's summary: every message is sent verbatim again (and
    compacted anew when due). Recorded as a `reset` snapshot."""
    context_reset(session=session, by=by)
