"""Recall's archive rows kept between sends (chat/search/archive_window.py): what a kept window
holds must always be what the database holds under the bound."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib import admin as django_admin
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import given
from hypothesis import strategies as st

from chat.admin import ChatMessageAdmin
from chat.context import context_compact
from chat.models import ChatMessage, ChatSession, MessageRole, MessageStatus
from chat.search import archive_rows, archive_window
from chat.search.archive_window import ArchiveRow, archive_window_read
from chat.services.sessions import message_truncate
from tests.chat.recall_setup import FORGETFUL_SUMMARY, recall_settings
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
    """The window as a send reads it: at the session's messages_version as stored now."""
    version = ChatSession.objects.values_list("messages_version", flat=True).get(pk=session.pk)
    return archive_window_read(
        owner_id=session.owner_id,
        session_id=session.pk,
        below_id=below_id,
        size=size,
        version=version,
    )


def test_a_kept_window_is_read_once_and_moves_with_its_bound(owner):
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=20)]
    first = _read(session, below_id=ids[20])
    assert [r.id for r in first.rows] == _ids_in_db(session, below_id=ids[20], size=10)
    assert first.more
    assert first.rows[0].folded == first.rows[0].content.casefold()
    version = ChatSession.objects.values_list("messages_version", flat=True).get(pk=session.pk)
    read = {"owner_id": session.owner_id, "session_id": session.pk, "size": 10, "version": version}
    with CaptureQueriesContext(connection) as same:
        again = archive_window_read(below_id=ids[20], **read)
    assert len(same) == 0 and again is first
    # The bound moves on by a few messages: only those are read; the oldest fall off.
    with CaptureQueriesContext(connection) as moved:
        later = archive_window_read(below_id=ids[26], **read)
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


def test_rows_deleted_by_a_truncation_never_come_back_when_the_bound_moves_past_them(owner):
    """A cut under the kept bound, then enough new messages that the next bound lies above the
    old one: a kept window extended by what lies between would still hold the deleted rows."""
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=10)]
    _read(session, below_id=ids[18])
    message_truncate(session=session, message_id=ids[12])
    new = [m.pk for m in make_conversation(session, turns=3)]
    after = _read(session, below_id=new[-1])
    assert [r.id for r in after.rows] == _ids_in_db(session, below_id=new[-1], size=10)
    assert not set(ids[12:]) & {r.id for r in after.rows}


def test_a_message_edited_or_deleted_in_the_admin_is_read_again(owner):
    session = ChatSessionFactory.create(owner=owner)
    made = make_conversation(session, turns=5)
    bound = made[-1].pk
    assert any("question 0" in r.content for r in _read(session, below_id=bound).rows)
    message_admin = ChatMessageAdmin(ChatMessage, django_admin.site)
    made[0].content = "redacted"
    message_admin.save_model(None, made[0], None, True)
    rows = _read(session, below_id=bound).rows
    assert "redacted" in [r.content for r in rows]
    assert not any("question 0" in r.content for r in rows)
    message_admin.delete_queryset(None, ChatMessage.objects.filter(pk=made[1].pk))
    assert made[1].pk not in [r.id for r in _read(session, below_id=bound).rows]


def test_a_message_moved_to_another_session_in_the_admin_leaves_the_first(owner):
    session, other = ChatSessionFactory.create_batch(2, owner=owner)
    made = make_conversation(session, turns=5)
    make_conversation(other, turns=1)
    bound = made[-1].pk
    assert made[0].pk in [r.id for r in _read(session, below_id=bound).rows]
    made[0].session = other
    ChatMessageAdmin(ChatMessage, django_admin.site).save_model(None, made[0], None, True)
    assert made[0].pk not in [r.id for r in _read(session, below_id=bound).rows]


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
        owner_id=outsider.pk, session_id=session.pk, below_id=ids[-1], size=10, version=0
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


def test_a_window_of_long_messages_is_kept_with_its_newest_rows(owner, monkeypatch):
    """A chat of long replies is kept too, with the newest rows its text bound holds (a review
    found 1,000 rows of 1-3k-character replies over the entry bound, so never kept), on the
    first read and as the bound moves."""
    session = ChatSessionFactory.create(owner=owner)
    made = make_conversation(session, turns=12, words=60)
    monkeypatch.setattr(archive_window, "ROWS_RUNES_MAX", 3000)
    bound = made[-4].pk
    window = _read(session, below_id=bound, size=100)
    assert window.more and window.rows
    assert [r.id for r in window.rows] == _ids_in_db(session, below_id=bound, size=len(window.rows))
    assert window.runes == sum(len(r.content) + len(r.folded) for r in window.rows) <= 3000
    assert (session.owner_id, session.pk) in archive_window._windows
    moved = _read(session, below_id=made[-1].pk, size=100)
    assert moved.more and moved.rows[0].id == made[-2].pk
    assert moved.runes == sum(len(r.content) + len(r.folded) for r in moved.rows) <= 3000
    assert [r.id for r in moved.rows] == _ids_in_db(
        session, below_id=made[-1].pk, size=len(moved.rows)
    )


_TEXTS = (
    "Deploy db.example.org on Friday (port 5432).",
    "The door code is 4471-KX, the key under the blue pot!",
    "我的密码是 hunter2，端口是8080。生日在五月",
    "Straße und STRASSE; naïve café — ÄRGER",
    "painting, painted, paints... and PAINT-7",
    "a--b c__d e:f/g #tag @user",
    "ice cream truck? nice cream trucks!",
)
_TERMS = (
    "db.example.org",
    "example",
    "5432",
    "4471-kx",
    "blue pot",
    "pot!",
    "密码",
    "端口是",
    "8080",
    "strasse",
    "straße",
    "ärger",
    "café",
    "paint",
    "paint-7",
    "a--b",
    "c__d",
    "e:f/g",
    "#tag",
    "tag",
    "@user",
    "ice cream truck",
    "cream trucks!",
    "ream truc",
    "nowhere",
    "t",
    ".",
)


def test_a_window_finds_exactly_the_rows_that_contain_a_term(owner):
    """A window must find what `term in text` finds: every term, phrase and bit of
    punctuation, before and after the window moves and its oldest rows fall off."""
    session = ChatSessionFactory.create(owner=owner)
    made = [
        ChatMessage.objects.create(
            session=session,
            role=(MessageRole.USER, MessageRole.ASSISTANT)[i % 2],
            content=_TEXTS[i % len(_TEXTS)] + f" #{i}",
        )
        for i in range(30)
    ]
    for bound in (made[12].pk, made[20].pk, made[29].pk):
        window = _read(session, below_id=bound, size=9)
        for term in (*_TERMS, "#1", "#2"):
            term = term.casefold()
            expected = tuple(r.id for r in window.rows if term in r.content.casefold())
            assert window.containing(term) == expected, term


_ALPHABET = st.sampled_from("aAbß é.-_:#,!?密码\n\t\u2028\x1c\u3000 İ")


@given(
    texts=st.lists(st.text(_ALPHABET, max_size=24), min_size=1, max_size=8),
    pick=st.tuples(st.integers(0, 7), st.integers(0, 23), st.integers(1, 8)),
    extra=st.text(_ALPHABET, min_size=1, max_size=6),
)
def test_a_window_finds_what_substring_search_finds_and_again_from_its_kept_terms(
    texts, pick, extra
):
    rows = [
        ArchiveRow(i + 1, MessageRole.USER, datetime.now(UTC), text, text.casefold())
        for i, text in enumerate(texts)
    ]
    newest_first = rows[::-1]
    window = archive_window._window(
        below_id=len(rows) + 1, version=0, rows=newest_first, more=False, size=99, read_at=0.0
    )
    source = texts[pick[0] % len(texts)].casefold()
    for term in (source[pick[1] : pick[1] + pick[2]], extra.casefold()):
        expected = tuple(r.id for r in newest_first if term in r.content.casefold())
        assert window.containing(term) == expected
        if not any(c.isspace() for c in term):
            assert window.matched[term] == expected  # kept, and found there the next time
            assert window.containing(term) is window.matched[term]
        else:
            assert term not in window.matched  # a phrase is scanned each time


def test_the_terms_a_window_kept_are_bounded(monkeypatch):
    monkeypatch.setattr(archive_rows, "MATCHED_TERMS_MAX", 3)
    rows = [ArchiveRow(1, MessageRole.USER, datetime.now(UTC), "alpha beta", "alpha beta")]
    window = archive_window._window(
        below_id=2, version=0, rows=rows, more=False, size=9, read_at=0.0
    )
    for term in ("alpha", "beta", "gamma", "delta", "alpha", "alpha beta", "a" * 65):
        assert window.containing(term) == (() if term in ("gamma", "delta", "a" * 65) else (1,))
        assert len(window.matched) <= 3
    assert "alpha beta" not in window.matched and "a" * 65 not in window.matched


def test_a_moved_window_carries_its_words_over_and_finds_them_in_its_new_rows(owner):
    """The window a moved bound reads keeps the words its predecessor was asked, matched in
    the rows it added and no longer in those that fell off its end; the predecessor's own
    stay as they were."""
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=6)]
    first = _read(session, below_id=ids[6])
    assert first.containing("zebra") == ()
    assert first.containing("question") != ()
    said = ChatMessage.objects.create(session=session, role=MessageRole.USER, content="A Zebra!")
    later = ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content="ok")
    moved = _read(session, below_id=later.pk)
    assert moved is not first
    assert moved.matched["zebra"] == (said.pk,) == moved.containing("zebra")
    expected = tuple(r.id for r in moved.rows if "question" in r.folded)
    assert moved.matched["question"] == expected
    assert ids[0] not in {r.id for r in moved.rows}  # its oldest fell off the end
    assert first.containing("zebra") == ()


@given(
    texts=st.lists(st.text(_ALPHABET, max_size=12), min_size=2, max_size=14),
    split=st.integers(1, 13),
    size=st.integers(1, 10),
    terms=st.lists(st.text(_ALPHABET, min_size=1, max_size=3), min_size=1, max_size=4),
)
def test_a_moved_window_keeps_exactly_the_matches_a_scan_of_its_rows_finds(
    texts, split, size, terms
):
    rows = [
        ArchiveRow(i + 1, MessageRole.USER, datetime.now(UTC), text, text.casefold())
        for i, text in enumerate(texts)
    ]
    split = min(split, len(rows) - 1)
    older, added = rows[:split][::-1], rows[split:][::-1]
    kept = archive_window._window(
        below_id=split + 1, version=0, rows=older[:size], more=False, size=size, read_at=0.0
    )
    asked = [t.casefold() for t in terms if not any(c.isspace() for c in t)]
    for term in asked:
        kept.containing(term)
    moved_rows = [*added, *kept.rows][:size]
    carried = archive_rows.matched_moved(kept, added=added, rows=moved_rows)
    assert set(carried) == set(kept.matched)
    for term, ids in carried.items():
        assert ids == tuple(r.id for r in moved_rows if term in r.folded), term


def test_a_bound_moved_far_reads_the_window_anew(owner, monkeypatch):
    monkeypatch.setattr(archive_window, "_DELTA_ROWS_MAX", 3)
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=20)]
    _read(session, below_id=ids[10])
    moved = _read(session, below_id=ids[30])
    assert [r.id for r in moved.rows] == _ids_in_db(session, below_id=ids[30], size=10)
    assert moved.more


def test_a_window_stays_kept_through_a_compaction(owner, fake_llm, settings, tmp_path):
    """A compaction moves the summary and the anchor, not a message: the window read before it
    is still what the database holds, and the send after it (or during an import's compaction,
    committed chunk by chunk) must not read the window's rows again before its first token."""
    recall_settings(settings, tmp_path)
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=12, words=12)]
    before = _read(session, below_id=ids[2])
    fake_llm.script_summary(FORGETFUL_SUMMARY)
    result = context_compact(session_id=session.pk, trigger="manual", force=True)
    assert result.outcome == "committed", result
    session.refresh_from_db()
    assert session.context_version > 0 and session.messages_version == 0
    with CaptureQueriesContext(connection) as kept:
        again = _read(session, below_id=ids[2])
    # The version's own read, and no row of the window.
    assert len(kept) == 1 and again is before
    # The send after it: its bound is the new anchor, above the old one; only the rows between
    # are read, and the window is what the database holds under it.
    anchor = session.verbatim_since_message_id
    assert anchor is not None and anchor > ids[2]
    with CaptureQueriesContext(connection) as moved:
        after = _read(session, below_id=anchor)
    assert len(moved) == 2
    assert [r.id for r in after.rows] == _ids_in_db(session, below_id=anchor, size=10)


def test_a_change_to_stored_messages_moves_their_version_and_nothing_else_does(owner, fake_llm):
    session = ChatSessionFactory.create(owner=owner)
    made = make_conversation(session, turns=6)
    fake_llm.script_summary(FORGETFUL_SUMMARY)
    assert context_compact(session_id=session.pk, trigger="manual", force=True).changed
    session.refresh_from_db()
    assert session.messages_version == 0
    ChatMessageAdmin(ChatMessage, django_admin.site).save_model(None, made[0], None, True)
    session.refresh_from_db()
    assert session.messages_version == 1
    message_truncate(session=session, message_id=made[-2].pk)
    session.refresh_from_db()
    assert session.messages_version == 2


def test_a_windows_rows_are_dated_as_stored_and_each_date_read_once(owner):
    """Its rows keep created_at as the database gave it (text on SQLite); the window reads it
    when recall quotes a row: the stored instant, aware, in UTC, kept for the next send."""
    archive_window.archive_windows_forget()
    session = ChatSessionFactory.create(owner=owner)
    ids = [m.pk for m in make_conversation(session, turns=5)]
    window = _read(session, below_id=ids[-1])
    stored = dict(ChatMessage.objects.filter(session=session).values_list("id", "created_at"))
    for row in window.rows:
        when = window.created_at(row.id, row.stamp)
        assert when == stored[row.id] and when.utcoffset().total_seconds() == 0
    assert set(window.dates) == {r.id for r in window.rows}
    # A message outside the window is dated, not kept.
    assert window.created_at(ids[-1], stored[ids[-1]]) == stored[ids[-1]]
    assert ids[-1] not in window.dates
