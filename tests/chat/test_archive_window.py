"""Recall's archive rows kept between sends (chat/search/archive_window.py): what a kept window
holds must always be what the database holds under the bound."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.models import ChatMessage, MessageRole, MessageStatus
from chat.search import archive_window
from chat.search.archive_window import archive_window_read
from chat.services.sessions import message_truncate
from tests.factories import ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db


def _ids_in_db(session, *, below_id: int, size: int) -> list[int]:
    rows = (
        ChatMessage.objects.filter(
            session=session,
            id__lt=below_id,
            role__in=(MessageRole.USER, MessageRole.ASSISTANT),
        )
        .exclude(status__in=(MessageStatus.STREAMING, MessageStatus.FAILED))
        .exclude(content="")
        .order_by("-id")
        .values_list("id", flat=True)
    )
    return list(rows[:size])


def _read(session, *, below_id: int, size: int = 10):
    return archive_window_read(
        owner_id=session.owner_id, session_id=session.pk, below_id=below_id, size=size
    )


def test_a_kept_window_is_read_once_and_moves_with_its_bound(owner):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=20)]
    first = _read(session, below_id=ids[20])
    assert [r.id for r in first.rows] == _ids_in_db(session, below_id=ids[20], size=10)
    assert first.more
    assert first.rows[0].folded == first.rows[0].content.casefold()
    with CaptureQueriesContext(connection) as same:
        again = _read(session, below_id=ids[20])
    assert len(same) == 0 and again is first
    # The bound moves on by a few messages: only those are read; the oldest fall off.
    with CaptureQueriesContext(connection) as moved:
        later = _read(session, below_id=ids[26])
    assert len(moved) == 1
    assert [r.id for r in later.rows] == _ids_in_db(session, below_id=ids[26], size=10)


def test_a_truncated_session_never_recalls_what_was_deleted(owner):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=10)]
    _read(session, below_id=ids[18])
    message_truncate(session=session, message_id=ids[12])
    # The next send's bound lies under the cut (its tail's first message survived it).
    after = _read(session, below_id=ids[8])
    assert [r.id for r in after.rows] == _ids_in_db(session, below_id=ids[8], size=10)
    assert all(r.id < ids[12] for r in after.rows)


def test_only_messages_the_model_is_sent_are_kept(owner):
    session = ChatSessionFactory.create(owner=owner)
    kept = ChatMessage.objects.create(session=session, role=MessageRole.USER, content="keep me")
    for role, status, content in (
        (MessageRole.ASSISTANT, MessageStatus.FAILED, "a failed reply"),
        (MessageRole.ASSISTANT, MessageStatus.STREAMING, "a reply still streaming"),
        (MessageRole.TOOL, MessageStatus.COMPLETE, "text fetched from outside"),
        (MessageRole.SYSTEM, MessageStatus.COMPLETE, "a system note"),
        (MessageRole.ASSISTANT, MessageStatus.COMPLETE, ""),
    ):
        ChatMessage.objects.create(session=session, role=role, status=status, content=content)
    bound = ChatMessage.objects.create(session=session, role=MessageRole.USER, content="now")
    window = _read(session, below_id=bound.pk)
    assert [r.id for r in window.rows] == [kept.pk]
    assert not window.more


def test_another_owners_session_id_finds_nothing(owner, outsider):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=5)]
    window = archive_window_read(
        owner_id=outsider.pk, session_id=session.pk, below_id=ids[-1], size=10
    )
    assert window.rows == []


def test_the_cache_is_bounded_least_recently_used_first_out(owner, monkeypatch):
    sessions = [ChatSessionFactory.create(owner=owner) for _ in range(3)]
    bounds = [make_conversation(s, turns=3)[-1].pk for s in sessions]
    one = _read(sessions[0], below_id=bounds[0]).runes
    monkeypatch.setattr(archive_window, "CACHE_RUNES_MAX", 2 * one)
    _read(sessions[1], below_id=bounds[1])
    _read(sessions[0], below_id=bounds[0])  # used again: the newest
    _read(sessions[2], below_id=bounds[2])
    kept = {key[1] for key in archive_window._windows}
    assert kept == {sessions[0].pk, sessions[2].pk}
    assert archive_window._kept_runes == sum(w.runes for w in archive_window._windows.values())
