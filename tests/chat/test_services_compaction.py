"""The `compaction` events of a compaction outside a send (chat/services/compaction.py): every
outcome is named, and the end carries the budget afterwards, so the page's ring and notice tell
the truth without waiting for the next reply."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from cadau.contextconfig import ContextConfig
from chat import hooks
from chat.context import context_budget_from_db
from chat.models import ChatSession
from chat.services import compaction
from tests.factories import ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db

SMALL = ContextConfig(
    input_budget_runes=4000, threshold_pct=60, target_pct=30, summary_max_runes=600, min_verbatim=2
)


@pytest.fixture
def published(monkeypatch) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    monkeypatch.setattr(
        compaction, "event_publish_now", lambda *, session_id, event: events.append(event)
    )
    return events


@pytest.fixture
def session(settings) -> ChatSession:
    settings.CHAT_CONTEXT = SMALL
    created: ChatSession = ChatSessionFactory.create()
    make_conversation(created, turns=12, words=12)
    return created


def test_a_committed_compaction_ends_with_the_budget_after_it(session, fake_llm, published):
    before = context_budget_from_db(session_id=session.pk)
    result = compaction.session_compact(session_id=session.pk, trigger="after_reply")
    assert result.outcome == "committed"
    start, end = published
    assert start == {"type": "compaction", "state": "started"}
    assert end["state"] == "done" and end["outcome"] == "committed"
    assert end["messages_rolled"] == result.messages_rolled > 0
    assert end["context_budget"] == context_budget_from_db(session_id=session.pk)
    assert end["context_budget"]["used_runes"] < before["used_runes"]


def test_nothing_to_cut_is_reported_as_skipped(settings, fake_llm, published):
    settings.CHAT_CONTEXT = SMALL
    small = ChatSessionFactory.create()
    make_conversation(small, turns=1, words=3)
    compaction.session_compact(session_id=small.pk, trigger="manual", force=True)
    end = published[-1]
    assert (end["state"], end["outcome"], end["messages_rolled"]) == ("skipped", "skipped", 0)
    assert end["context_budget"] == context_budget_from_db(session_id=small.pk)
    assert fake_llm.count() == 0


def test_another_compaction_running_is_reported_as_busy(session, fake_llm, published):
    ChatSession.objects.filter(pk=session.pk).update(
        compaction_lease_token="other", compaction_lease_until=timezone.now() + timedelta(60)
    )
    compaction.session_compact(session_id=session.pk, trigger="after_reply")
    end = published[-1]
    assert (end["state"], end["outcome"]) == ("skipped", "busy")
    assert "context_budget" in end


def test_a_lost_compare_and_swap_is_reported_as_conflict(session, fake_llm, published):
    def meddle(*, session, messages):
        ChatSession.objects.filter(pk=session.pk).update(context_version=41)

    hooks.pre_compaction_hooks.append(meddle)
    try:
        compaction.session_compact(session_id=session.pk, trigger="after_reply")
    finally:
        hooks.pre_compaction_hooks.remove(meddle)
    end = published[-1]
    assert (end["state"], end["outcome"], end["messages_rolled"]) == ("skipped", "conflict", 0)


def test_a_failed_summary_is_reported_as_failed(session, fake_llm, published):
    fake_llm.fail_next("500", times=10)
    compaction.session_compact(session_id=session.pk, trigger="after_reply")
    end = published[-1]
    assert (end["state"], end["outcome"]) == ("failed", "failed")
