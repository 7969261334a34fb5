"""Concurrent sends and background compaction, over real threads and real DB connections."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connections
from rest_framework.test import APIClient

from cadau.contextconfig import ContextConfig
from chat.models import ChatMessage, ContextSnapshot, MessageStatus, SnapshotOutcome
from devtools.introspect import background_wait
from tests.factories import ChatSessionFactory, make_conversation
from tests.fixtures_llm import summary_of

pytestmark = pytest.mark.django_db(transaction=True)

SMALL = ContextConfig(
    input_budget_runes=4000, threshold_pct=80, target_pct=50, summary_max_runes=600, min_verbatim=2
)


def _assert_summarised_at_most_once(session_id: int) -> None:
    """Committed snapshots fold disjoint, increasing ranges: no message is summarised twice, and
    the anchor only ever moves forward."""
    snaps = ContextSnapshot.objects.filter(
        session_id=session_id, outcome=SnapshotOutcome.COMMITTED
    ).order_by("id")
    last_to = 0
    for snap in snaps:
        start, end, anchor = (
            snap.covers_from_message_id,
            snap.covers_to_message_id,
            snap.verbatim_since_message_id,
        )
        assert start is not None and end is not None and anchor is not None
        assert start > last_to, "a message was summarised twice"
        assert anchor > end
        last_to = end


def test_twenty_concurrent_sends_lose_nothing_and_summarise_each_message_once(
    owner, fake_llm, settings
):
    settings.CHAT_CONTEXT = SMALL
    settings.CHAT_SEND_QUEUE_SECONDS = 120
    session = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=6, words=20)
    fake_llm.configure(reply_words=60)  # replies big enough to force several compactions
    results: dict[int, int] = {}
    errors: list[BaseException] = []

    def send(i: int) -> None:
        try:
            client = APIClient()
            client.force_authenticate(owner)
            r = client.post(
                "/api/v1/chat/send",
                {
                    "session_id": session.pk,
                    "content": f"concurrent question {i}",
                    "client_id": f"c{i}",
                },
                format="json",
            )
            results[i] = r.status_code
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors
    assert results == dict.fromkeys(range(20), 200)

    msgs = list(ChatMessage.objects.filter(session=session).order_by("id"))
    users = [m.content for m in msgs if m.role == "user" and m.content.startswith("concurrent")]
    assert sorted(users) == sorted(f"concurrent question {i}" for i in range(20))
    # never interleaved: every new user message is followed directly by its own reply
    for i, m in enumerate(msgs):
        if m.role == "user" and m.content.startswith("concurrent"):
            reply = msgs[i + 1]
            assert reply.role == "assistant" and reply.metadata["reply_to"] == m.pk
            assert reply.status == MessageStatus.COMPLETE
    session.refresh_from_db()
    assert session.message_count == len(msgs) == 12 + 40
    assert ContextSnapshot.objects.filter(
        session=session, outcome=SnapshotOutcome.COMMITTED
    ).exists()
    _assert_summarised_at_most_once(session.pk)


def test_concurrent_compactions_of_one_session_commit_once(owner, fake_llm, settings):
    from chat.context import context_compact

    settings.CHAT_CONTEXT = SMALL
    session = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=14, words=14)  # over the threshold; one chunk to fold
    fake_llm.configure(token_ms=5)  # slow summaries widen the race window
    outcomes: list[str] = []

    def roll() -> None:
        try:
            outcomes.append(context_compact(session_id=session.pk, trigger="before_send").outcome)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=roll) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert outcomes.count("committed") == 1, outcomes
    assert set(outcomes) <= {"committed", "busy", "skipped"}
    assert fake_llm.count("summary") == 1
    _assert_summarised_at_most_once(session.pk)


def _another_compaction_commits_after_the_first_read(monkeypatch, owner, settings):
    """A session over its threshold where the first read of its state is followed, before
    its reader claims the lease, by another compaction that commits and releases: the session
    and that other compaction's outcome (a list, filled once it ran)."""
    from chat.context import compaction

    settings.CHAT_CONTEXT = SMALL
    session = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=14, words=14)
    read = compaction.context_state_read
    others: list[str] = []

    def read_then_lose_the_race(**kwargs):
        state = read(**kwargs)
        if not others:
            others.append("running")
            others[0] = compaction.context_compact(
                session_id=session.pk, trigger="before_send"
            ).outcome
        return state

    monkeypatch.setattr(compaction, "context_state_read", read_then_lose_the_race)
    return session, others


def test_a_caller_that_read_before_another_committed_does_not_summarise_again(
    owner, fake_llm, settings, monkeypatch
):
    """The interleaving the thread race above hits only sometimes, made certain. This caller
    must not pay for a second summary of the same turns."""
    from chat.context import context_compact

    session, others = _another_compaction_commits_after_the_first_read(monkeypatch, owner, settings)
    outcome = context_compact(session_id=session.pk, trigger="before_send").outcome
    assert others == ["committed"]
    assert outcome == "skipped"
    assert fake_llm.count("summary") == 1
    _assert_summarised_at_most_once(session.pk)


def test_compact_now_after_another_compaction_committed_reads_again_and_compacts(
    owner, fake_llm, settings, monkeypatch
):
    """The same interleaving for "compact now": it was asked for, and nothing is running, so
    it must not answer "already running"; it reads the session again and compacts."""
    from chat.services.compaction import session_compact_now

    session, others = _another_compaction_commits_after_the_first_read(monkeypatch, owner, settings)
    result = session_compact_now(session_id=session.pk)
    assert others == ["committed"]
    assert result.outcome == "committed"
    assert fake_llm.count("summary") == 2
    _assert_summarised_at_most_once(session.pk)


def test_background_compaction_after_a_reply_spares_the_next_send(owner, fake_llm, settings):
    settings.CHAT_CONTEXT = SMALL
    settings.CHAT_BACKGROUND_COMPACTION = True
    session = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=7, words=20)  # just under the threshold
    client = APIClient()
    client.force_authenticate(owner)
    fake_llm.configure(reply_words=80)
    r = client.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "push it over"}, format="json"
    )
    assert r.status_code == 200
    background_wait(timeout=30)
    snap = ContextSnapshot.objects.get(session=session)
    assert snap.outcome == SnapshotOutcome.COMMITTED and snap.trigger == "after_reply"
    summary_calls = fake_llm.count("summary")
    r = client.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "next one"}, format="json"
    )
    assert r.status_code == 200
    # the send itself did not have to wait on a summary
    assert fake_llm.count("summary") == summary_calls


@pytest.mark.postgres_only
def test_truncation_during_a_summarising_call_keeps_its_summary_out(owner, fake_llm, settings):
    """A compaction reads the tail and summarises it without holding any lock; a truncation at
    or after the anchor meanwhile deletes messages that call was given. Its commit must lose,
    and the next compaction summarise only what survived. Runs on SQLite too; on PostgreSQL the
    two really overlap on separate connections."""
    from chat.context import context_compact
    from chat.llm import reset_provider
    from chat.services.sessions import message_truncate

    settings.CHAT_CONTEXT = SMALL
    settings.LLM_SUMMARY_TIMEOUT_SECONDS = 20.0
    reset_provider()
    session = ChatSessionFactory.create(owner=owner)
    rows = make_conversation(session, turns=14, words=14)
    cut = rows[4]  # the third question: well inside what the first compaction folds
    fake_llm.fail_next("hang", target="summary", seconds=15)
    outcomes: list[str] = []

    def compact() -> None:
        try:
            outcomes.append(
                context_compact(session_id=session.pk, trigger="manual", force=True).outcome
            )
        finally:
            connections.close_all()

    worker = threading.Thread(target=compact)
    worker.start()
    deadline = time.monotonic() + 10
    while fake_llm.count("summary") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake_llm.count("summary") == 1, "the summarising call never started"
    held = fake_llm.calls[-1]
    # The call in flight was handed the messages about to be deleted.
    assert "question 7" in json.dumps(held.body)
    result = message_truncate(session=session, message_id=cut.pk)
    assert result.deleted == 24 and not result.summary_rewound
    fake_llm.release()
    worker.join(timeout=30)
    assert outcomes == ["conflict"]

    session.refresh_from_db()
    assert session.context_summary == "" and session.verbatim_since_message_id is None
    snaps = list(ContextSnapshot.objects.filter(session=session).order_by("id"))
    assert [s.outcome for s in snaps] == [SnapshotOutcome.CONFLICT]
    assert snaps[0].covers_to_message_id > cut.pk  # what it would have committed

    # The next compaction folds only survivors.
    fake_llm.script_summary(summary_of("question 0 and its answer"))
    later = context_compact(session_id=session.pk, trigger="manual", force=True)
    assert later.outcome == "committed", later
    session.refresh_from_db()
    committed = ContextSnapshot.objects.get(session=session, outcome=SnapshotOutcome.COMMITTED)
    assert committed.covers_to_message_id < cut.pk
    assert session.verbatim_since_message_id in {r.pk for r in rows[:4]}
    assert session.context_summary == summary_of("question 0 and its answer")
    sent = json.dumps(fake_llm.calls[-1].body)
    assert "question 7" not in sent and "question 0" in sent


def test_a_send_that_finds_its_compaction_done_by_another_sends_the_new_summary(
    owner, fake_llm, settings, monkeypatch
):
    """Compact first (background compaction off): another caller committed between this send's
    read and its own try, which is `skipped`. The payload is built from the session as it is
    now (the new summary, the tail after its anchor), not from the state read before it."""
    import chat.turn.generate as turn_generate
    from chat.context import CompactionResult
    from tests.chat.recall_setup import FORGETFUL_SUMMARY

    settings.CHAT_CONTEXT = SMALL
    settings.CHAT_BACKGROUND_COMPACTION = False
    session = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=8, words=40)
    real = turn_generate.context_compact

    def compacted_by_another(**kwargs):
        assert real(**kwargs).outcome == "committed"
        return CompactionResult(outcome="skipped", trigger=kwargs["trigger"])

    monkeypatch.setattr(turn_generate, "context_compact", compacted_by_another)
    fake_llm.script_summary(FORGETFUL_SUMMARY)
    client = APIClient()
    client.force_authenticate(owner)
    r = client.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "and now?"}, format="json"
    )
    assert r.status_code == 200, r.content
    system = fake_llm.calls[-1].body["messages"][0]["content"]
    assert "The user asked many questions." in system
    session.refresh_from_db()
    sent = [m["content"] for m in fake_llm.calls[-1].body["messages"][1:]]
    archived = ChatMessage.objects.filter(
        session=session, id__lt=session.verbatim_since_message_id
    ).values_list("content", flat=True)
    assert not set(sent) & set(archived)


def test_a_send_whose_compaction_had_nothing_to_do_reads_nothing_again(
    owner, fake_llm, settings, monkeypatch
):
    """`skipped` is also "nothing to do" (the seed's loop, most sends): the state is read again
    only when the session moved."""
    import chat.turn.generate as turn_generate
    from chat.context import CompactionResult

    settings.CHAT_CONTEXT = SMALL
    settings.CHAT_BACKGROUND_COMPACTION = False
    session = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=8, words=40)
    tried: list[int] = []

    def nothing_to_do(**kwargs):
        tried.append(kwargs["session_id"])
        return CompactionResult(outcome="skipped", trigger=kwargs["trigger"])

    monkeypatch.setattr(turn_generate, "context_compact", nothing_to_do)
    fresh_reads: list[int] = []
    real = turn_generate.context_state_fresh

    def counted(**kwargs):
        fresh_reads.append(kwargs["session_id"])
        return real(**kwargs)

    monkeypatch.setattr(turn_generate, "context_state_fresh", counted)
    client = APIClient()
    client.force_authenticate(owner)
    r = client.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "and now?"}, format="json"
    )
    assert r.status_code == 200, r.content
    assert fake_llm.count("chat") == 1
    assert tried == [session.pk] and fresh_reads == []


def test_a_session_deleted_during_its_background_compaction_ends_it_quietly(
    owner, fake_llm, settings, caplog
):
    """The compaction's commit finds the session gone: before, its conflict snapshot failed on
    the session's foreign key, an ERROR with a traceback (a black-box probe)."""
    import logging

    from chat.llm import reset_provider
    from chat.services.sessions import session_delete
    from chat.turn.finish import compact_in_background
    from chat.workers import background_submit

    settings.CHAT_CONTEXT = SMALL
    settings.LLM_SUMMARY_TIMEOUT_SECONDS = 20.0
    reset_provider()
    session = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=14, words=14)
    fake_llm.fail_next("hang", target="summary", seconds=15)
    with caplog.at_level(logging.INFO):
        background_submit(compact_in_background, session_id=session.pk, trigger="after_reply")
        deadline = time.monotonic() + 10
        while fake_llm.count("summary") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fake_llm.count("summary") == 1, "the summarising call never started"
        session_delete(session=session)
        fake_llm.release()
        background_wait()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "chat_compaction_session_deleted" in caplog.text
