"""Recall's window read when a chat is opened (chat/search/recall_warm.py): the page, the
history's newest page and the socket start it; the next send finds the window kept; nothing is
read for an outsider, a short chat, or with recall off."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from django.test import Client

from chat import workers
from chat.context.compose import RECALL_HEADING
from chat.models import ChatMessage, ChatSession
from chat.search import archive_window, recall_warm
from chat.search.archive_window import archive_window_ready
from chat.search.recall_auto import WINDOW_ROWS
from chat.search.recall_warm import WARM_MIN_MESSAGES, recall_window_warm
from devtools.introspect import background_wait
from tests.chat.recall_setup import FORGETFUL_SUMMARY, recall_settings, send
from tests.factories import ChatSessionFactory, make_conversation


def _summarised(owner, *, turns: int = 60) -> ChatSession:
    """A long chat whose older half is summarised: an archive below its anchor."""
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    rows = make_conversation(session, turns=turns)
    ChatSession.objects.filter(pk=session.pk).update(
        context_summary=FORGETFUL_SUMMARY, verbatim_since_message_id=rows[turns].pk
    )
    session.refresh_from_db()
    return session


def _long_unsummarised(owner) -> ChatSession:
    """A chat never compacted, longer than the budget: the tail read stops short of its start."""
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=WARM_MIN_MESSAGES * 2, words=12)
    session.refresh_from_db()
    return session


def _kept(session: ChatSession) -> bool:
    return archive_window_ready(
        owner_id=session.owner_id,
        session_id=session.pk,
        version=session.messages_version,
        below_id=session.verbatim_since_message_id,
    )


@pytest.fixture
def submitted(monkeypatch) -> list[dict]:
    """The warming jobs asked for, not run."""
    calls: list[dict] = []

    def record(key, fn, **kwargs):
        calls.append({"key": key, **kwargs})
        return object()

    monkeypatch.setattr(recall_warm, "warm_submit", record)
    return calls


@pytest.fixture
def window_reads(monkeypatch) -> list[int | None]:
    """Each window read's `from_id`: None for a whole window, an id for the rows a moved bound
    passed."""
    reads: list[int | None] = []
    real = archive_window.window_rows

    def counted(*, scope, rows, from_id=None):
        reads.append(from_id)
        return real(scope=scope, rows=rows, from_id=from_id)

    monkeypatch.setattr(archive_window, "window_rows", counted)
    return reads


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("make", [_summarised, _long_unsummarised])
def test_a_chat_opened_has_its_window_read_before_the_send(
    api, owner, fake_llm, settings, tmp_path, window_reads, make
):
    recall_settings(settings, tmp_path)
    session = make(owner)
    r = api.get("/api/v1/chat/history", {"session_id": session.pk})
    assert r.status_code == 200
    background_wait()
    assert _kept(session)
    # A whole window (in steps of STEP_ROWS rows, each a statement: background work).
    whole = len(window_reads)
    assert whole >= 1 and set(window_reads) == {None}
    # With its word list (chat/search/window_words.py), built then too.
    assert archive_window._windows[(owner.pk, session.pk)].word_rows is not None
    fake_llm.script("Sure.")
    send(api, session, "what was question 3 about?")
    # It recalled from that window (the archive's turn 3 is in no verbatim tail here).
    sent = fake_llm.calls[-1].raw_body.decode()
    assert RECALL_HEADING in sent and "question 3 question 3" in sent
    # The send found it kept: at most the rows its bound moved past (the new message moves a
    # never-compacted chat's tail), never a whole window again.
    assert None not in window_reads[whole:]
    assert ChatMessage.objects.filter(session=session).count() == session.message_count + 2


def test_the_page_and_the_newest_history_page_start_it(api, owner, settings, submitted):
    settings.CHAT_CONTEXT_RECALL = True
    session = _summarised(owner)
    web = Client()
    web.force_login(owner)
    assert web.get(f"/chat/{session.pk}/").status_code == 200
    assert api.get("/api/v1/chat/history", {"session_id": session.pk}).status_code == 200
    assert [c["session_id"] for c in submitted] == [session.pk, session.pk]
    assert all(c["owner_id"] == owner.pk for c in submitted)
    # An older page, or the window around a message: the chat is being read, not written in.
    first = ChatMessage.objects.filter(session=session).order_by("id").first()
    assert first is not None
    r = api.get("/api/v1/chat/history", {"session_id": session.pk, "around": first.pk})
    assert r.status_code == 200
    assert len(submitted) == 2


def test_nothing_is_read_for_an_outsider_a_short_chat_or_with_recall_off(
    api, outsider_api, owner, settings, submitted
):
    settings.CHAT_CONTEXT_RECALL = True
    session = _summarised(owner)
    assert outsider_api.get("/api/v1/chat/history", {"session_id": session.pk}).status_code == 404
    short = ChatSessionFactory.create(owner=owner)
    make_conversation(short, turns=5)
    assert api.get("/api/v1/chat/history", {"session_id": short.pk}).status_code == 200
    settings.CHAT_CONTEXT_RECALL = False
    assert api.get("/api/v1/chat/history", {"session_id": session.pk}).status_code == 200
    assert submitted == []


@pytest.mark.django_db
def test_a_window_kept_with_its_word_list_is_not_read_again(owner, settings, tmp_path, submitted):
    recall_settings(settings, tmp_path)
    session = _summarised(owner)
    # Kept by a send: without its word list, which opening the chat builds.
    archive_window.archive_window_read(
        owner_id=owner.pk,
        session_id=session.pk,
        below_id=session.verbatim_since_message_id,
        size=WINDOW_ROWS,
        version=session.messages_version,
    )
    assert recall_warm.recall_window_warm_start(session=session) is True
    assert recall_window_warm(session_id=session.pk, owner_id=owner.pk)
    assert archive_window._windows[(owner.pk, session.pk)].word_rows is not None
    submitted.clear()
    assert recall_warm.recall_window_warm_start(session=session) is False
    assert submitted == []
    # A message edited since (its version moved): read again.
    ChatSession.objects.filter(pk=session.pk).update(messages_version=session.messages_version + 1)
    session.refresh_from_db()
    assert recall_warm.recall_window_warm_start(session=session) is True


def test_opening_chat_after_chat_is_counted(api, owner, settings, submitted):
    settings.CHAT_CONTEXT_RECALL = True
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "recall_warm": "2/min"}
    sessions = [_summarised(owner, turns=20) for _ in range(3)]
    for session in sessions:
        assert api.get("/api/v1/chat/history", {"session_id": session.pk}).status_code == 200
    # The third opens as before (nothing refused), without its window read ahead.
    assert [c["session_id"] for c in submitted] == [sessions[0].pk, sessions[1].pk]


@pytest.mark.django_db
def test_nothing_is_read_under_the_seeds_strategy(owner, settings, tmp_path):
    recall_settings(settings, tmp_path)
    settings.CHAT_CONTEXT = dataclasses.replace(settings.CHAT_CONTEXT, strategy="seed")
    session = _summarised(owner)
    assert recall_window_warm(session_id=session.pk, owner_id=owner.pk) is False
    assert not _kept(session)


@pytest.mark.django_db
def test_the_job_reads_only_its_owners_session(owner, outsider, settings, tmp_path):
    recall_settings(settings, tmp_path)
    session = _summarised(owner)
    assert recall_window_warm(session_id=session.pk, owner_id=outsider.pk) is False
    assert not _kept(session)
    assert recall_window_warm(session_id=session.pk + 1000, owner_id=owner.pk) is False
    # Everything fits and nothing is summarised: no archive, nothing read.
    short = ChatSessionFactory.create(owner=owner)
    make_conversation(short, turns=3)
    assert recall_window_warm(session_id=short.pk, owner_id=owner.pk) is False
    assert not _kept(short)


@pytest.mark.django_db(transaction=True)
def test_a_chat_found_with_nothing_to_read_is_not_read_again_until_it_changes(
    api, owner, settings, tmp_path
):
    settings.CHAT_CONTEXT_RECALL = True
    settings.RUNTIME_DIR = tmp_path
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=WARM_MIN_MESSAGES)  # 200 short messages: all fit
    session.refresh_from_db()
    assert recall_warm.recall_window_warm_start(session=session)
    background_wait()
    assert not _kept(session)
    # Opened again as it was: nothing to do, no job, no rate spent.
    assert recall_warm.recall_window_warm_start(session=session) is False
    make_conversation(session, turns=1)
    session.refresh_from_db()
    assert recall_warm.recall_window_warm_start(session=session) is True
    background_wait()


def test_a_compaction_since_the_window_was_read_makes_it_read_again(
    owner, settings, tmp_path, submitted
):
    recall_settings(settings, tmp_path)
    session = _summarised(owner)
    assert recall_window_warm(session_id=session.pk, owner_id=owner.pk)
    assert recall_warm.recall_window_warm_start(session=session) is False
    # The anchor moves past the window's bound: the next send's bound moves with it.
    later = ChatMessage.objects.filter(session=session).order_by("-id")[10]
    ChatSession.objects.filter(pk=session.pk).update(verbatim_since_message_id=later.pk)
    session.refresh_from_db()
    assert recall_warm.recall_window_warm_start(session=session) is True
    assert [c["session_id"] for c in submitted] == [session.pk]


def test_the_seeds_strategy_starts_nothing(owner, settings, tmp_path, submitted):
    recall_settings(settings, tmp_path)
    settings.CHAT_CONTEXT = dataclasses.replace(settings.CHAT_CONTEXT, strategy="seed")
    session = _summarised(owner)
    assert recall_warm.recall_window_warm_start(session=session) is False
    assert submitted == []


@pytest.mark.django_db(transaction=True)
def test_a_job_under_way_is_neither_queued_again_nor_counted_again(api, owner, settings, tmp_path):
    recall_settings(settings, tmp_path)
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "recall_warm": "2/min"}
    first, second = _summarised(owner), _summarised(owner)
    release = threading.Event()
    workers.warm_submit("blocker", release.wait, timeout=5)  # the warming thread is busy
    try:
        for _ in range(3):
            r = api.get("/api/v1/chat/history", {"session_id": first.pk})
            assert r.status_code == 200
        assert workers.warm_waiting(("recall-window", first.pk))
    finally:
        release.set()
    background_wait()
    # One unit spent on the first chat's three opens: the second chat still gets its own.
    assert api.get("/api/v1/chat/history", {"session_id": second.pk}).status_code == 200
    background_wait()
    assert _kept(first) and _kept(second)
