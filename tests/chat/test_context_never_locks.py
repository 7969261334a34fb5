"""A session never becomes unsendable and an import is not summarised from its first message
(issue 25, items 5 and 7): a summary that outgrew a small budget yields for the call; the first
compaction of a long session never summarised archives its unread backlog for recall."""

from __future__ import annotations

import pytest

from cadau.contextconfig import ContextConfig
from chat.context import context_compact, context_payload_build, context_state_fresh
from chat.models import ChatMessage, ChatSession, MessageRole
from chat.search.recall_auto import recall_auto
from tests.factories import ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db(transaction=True)

TINY = ContextConfig(
    input_budget_runes=1500, threshold_pct=88, target_pct=60, summary_max_runes=6000
)


@pytest.fixture(autouse=True)
def runtime(settings, tmp_path):
    settings.RUNTIME_DIR = tmp_path
    settings.AGENT_MEMORY_STORAGE = ""


def test_the_summary_cap_scales_with_the_budget():
    assert TINY.summary_cap_runes == 800  # room for the headings and a few facts
    assert ContextConfig(input_budget_runes=16_000).summary_cap_runes == 2000
    assert ContextConfig().summary_cap_runes == 6000


def test_a_summary_that_outgrew_a_small_budget_never_refuses_a_short_send(
    api, owner, fake_llm, settings
):
    """Summary + system prompt over the budget: every send was `message_too_large` (16 of 24
    short sends with a model writing 1,400-character summaries). Now the summary yields."""
    settings.CHAT_CONTEXT = TINY
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=4, words=6)
    summary = "## Facts and decisions\n" + "".join(
        f"- fact {i}: " + "x" * 40 + "\n" for i in range(30)
    )
    assert len(summary) > 1400
    ChatSession.objects.filter(pk=session.pk).update(
        context_summary=summary, verbatim_since_message_id=ChatMessage.objects.last().pk
    )
    refused = 0
    for i in range(6):
        fake_llm.script(f"reply {i}")
        r = api.post(
            "/api/v1/chat/send",
            {"session_id": session.pk, "content": f"What is our project code? ({i})"},
            format="json",
        )
        refused += r.status_code != 200
    assert refused == 0
    for call in [c for c in fake_llm.calls if c.kind == "chat"]:
        sent = sum(len(m["content"] or "") for m in call.body["messages"])
        assert sent <= TINY.input_budget_runes
        assert call.body["messages"][-1]["content"].startswith("What is our project code?")


def test_a_message_that_cannot_fit_alone_is_still_refused_with_numbers(api, owner, settings):
    settings.CHAT_CONTEXT = TINY
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    r = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "z" * 1600}, format="json"
    )
    assert r.status_code == 413 or r.status_code == 400, r.content
    assert "1500" in r.content.decode() and ChatMessage.objects.filter(session=session).count() == 0


def test_an_imports_first_compaction_archives_its_backlog_for_recall(owner, fake_llm, settings):
    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=4000, min_verbatim=2)
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    fact = ChatMessage.objects.create(
        session=session, role=MessageRole.USER, content="The vault PIN is 8812-QQ."
    )
    make_conversation(session, turns=300, words=10)  # ~ 60,000 runes, never summarised
    state = context_state_fresh(session_id=session.pk)
    assert state.backlog
    result = context_compact(session_id=session.pk, trigger="before_send")
    assert result.outcome == "committed", result
    # Two chunks of the newest turns, each with at most one retry of the guard; it was one
    # call per input cap over the whole history.
    assert result.llm_calls <= 4
    session.refresh_from_db()
    assert session.verbatim_since_message_id > fact.pk
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content="vault PIN?")
    payload = context_payload_build(
        state=context_state_fresh(session_id=session.pk, query="vault PIN?"), recall=recall_auto
    )
    assert "8812-QQ" in payload.messages[0]["content"]


def test_with_recall_off_an_import_is_summarised_whole(owner, fake_llm, settings):
    settings.CHAT_CONTEXT_RECALL = False
    settings.CHAT_CONTEXT = ContextConfig(input_budget_runes=4000, min_verbatim=2)
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=150, words=10)
    result = context_compact(session_id=session.pk, trigger="before_send")
    assert result.outcome == "committed" and result.llm_calls > 2


def test_a_10000_message_import_is_steady_after_few_summarising_calls(
    api, owner, fake_llm, settings
):
    """seed_demo or an import: 10,000 messages, no summary, default budget. Its first sends cost
    94 summarising calls of ~50 KB before (the whole history folded in); now at most 8."""
    settings.CHAT_CONTEXT = ContextConfig()
    settings.CHAT_BACKGROUND_COMPACTION = False  # the send waits: the calls are counted here
    # A 50,000-rune summarising prompt on a loaded machine: a timeout's retry is a call too.
    settings.LLM_TIMEOUT_SECONDS = settings.LLM_SUMMARY_TIMEOUT_SECONDS = 30.0
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    make_conversation(session, turns=5000, words=12)
    for i in range(3):
        fake_llm.script(f"reply {i}")
        r = api.post(
            "/api/v1/chat/send",
            {"session_id": session.pk, "content": f"question {i} again?"},
            format="json",
        )
        assert r.status_code == 200, r.content
    assert fake_llm.count("summary") <= 8
    assert not context_state_fresh(session_id=session.pk).backlog
