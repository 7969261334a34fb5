"""Recall (chat/search/recall.py): the `history_search` tool and automatic recall bring back a
fact that the summary dropped. The model is the fake server over the real httpx client; its
`quote` replies answer only from what the call was actually sent, so a fact can only be quoted
if recall put it in the payload."""

from __future__ import annotations

import logging

import pytest

from cadau.contextconfig import ContextConfig
from chat.context import context_compact
from chat.models import ChatMessage, ChatSession, MessageRole
from chat.search import recall
from chat.search.recall import recall_search, recall_terms
from chat.tools import ToolContext, tool_run, tools_enabled_for
from tests.factories import AgentFactory, ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db(transaction=True)

SMALL = ContextConfig(
    input_budget_runes=4000, threshold_pct=60, target_pct=30, summary_max_runes=600, min_verbatim=2
)
# Passes the summary guard (every heading, shorter than what it replaces) and holds no fact.
FORGETFUL_SUMMARY = (
    "## Facts and decisions\n- The user asked many questions.\n## Open tasks\n- none\n"
    "## User constraints and preferences\n- none\n## Pending questions\n- none\n"
    "## Exact identifiers\n- none"
)
FACT = "Note for later: the door code is 4471-KX and the spare key is under the blue pot."


@pytest.fixture(autouse=True)
def runtime(settings, tmp_path):
    settings.RUNTIME_DIR = tmp_path
    settings.AGENT_MEMORY_STORAGE = ""
    settings.CHAT_CONTEXT = SMALL


def _archived(owner, fake_llm, *, agent=None, fact: str = FACT) -> tuple[ChatSession, int]:
    """A session whose first turn (the fact) is summarised away by a summary that drops it."""
    session: ChatSession = ChatSessionFactory.create(owner=owner, agent=agent)
    planted = ChatMessage.objects.create(session=session, role=MessageRole.USER, content=fact)
    ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content="Noted.")
    make_conversation(session, turns=12, words=12)
    fake_llm.script_summary(FORGETFUL_SUMMARY)
    result = context_compact(session_id=session.pk, trigger="manual", force=True)
    assert result.outcome == "committed", result
    session.refresh_from_db()
    anchor = session.verbatim_since_message_id
    assert anchor is not None and anchor > planted.pk
    assert "4471" not in session.context_summary
    return session, planted.pk


def _send(api, session, content):
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": content}, format="json")
    assert r.status_code == 200, r.content
    return r.json()


def _reply(session) -> str:
    last = ChatMessage.objects.filter(session=session).order_by("-id").first()
    assert last is not None and last.role == MessageRole.ASSISTANT
    return last.content


def test_without_recall_the_model_cannot_answer(api, owner, fake_llm):
    session, _ = _archived(owner, fake_llm)
    fake_llm.script({"quote": "door code is"})
    _send(api, session, "What was the door code I gave you?")
    assert _reply(session) == "I do not know."


def test_automatic_recall_brings_the_dropped_fact_back(api, owner, fake_llm, settings, caplog):
    settings.CHAT_CONTEXT_RECALL = True
    session, planted = _archived(owner, fake_llm)
    fake_llm.script({"quote": "door code is"})
    with caplog.at_level(logging.INFO, logger="chat.search"):
        _send(api, session, "What was the door code I gave you?")
    assert "4471-KX" in _reply(session)
    system = fake_llm.calls[-1].body["messages"][0]["content"]
    assert recall.RECALL_HEADING in system and f"[message {planted} · user" in system
    line = next(r.message for r in caplog.records if "chat_context_recall" in r.message)
    assert "source=auto" in line and "hits=" in line and "runes=" in line
    # Under its own cap, whatever matched: here a tenth of the session's 4,000-rune budget.
    section = system[system.index(recall.RECALL_HEADING) : system.index(FORGETFUL_SUMMARY)]
    assert recall.recall_cap(session=session) == 400
    assert len(section) <= 400


def test_automatic_recall_never_takes_much_of_a_small_window(owner, fake_llm, settings):
    settings.CHAT_CONTEXT_RECALL = True
    session, _ = _archived(owner, fake_llm)
    settings.CHAT_CONTEXT_RECALL_MAX_RUNES = 250
    assert recall.recall_prompt_part(session=session) is None  # too small to be worth it
    settings.CHAT_CONTEXT_RECALL_MAX_RUNES = 1500
    settings.CHAT_CONTEXT = SMALL.with_overrides({"window_tokens": 4096}, source="test")
    assert recall.recall_cap(session=session) == 204  # 4096 // 20: two tokens a character
    assert recall.recall_prompt_part(session=session) is None
    settings.CHAT_CONTEXT = SMALL.with_overrides({"window_tokens": 32768}, source="test")
    assert recall.recall_cap(session=session) == 400  # the budget's tenth binds again
    assert recall.recall_prompt_part(session=session) is not None


def test_automatic_recall_is_counted_in_the_sends_payload(owner, fake_llm, settings):
    from chat.context import context_payload

    session, _ = _archived(owner, fake_llm)
    question = "Where is the spare key, and what is the door code?"
    without = context_payload(session_id=session.pk, query=question, compact=False)
    settings.CHAT_CONTEXT_RECALL = True
    with_recall = context_payload(session_id=session.pk, query=question, compact=False)
    assert with_recall.runes > without.runes + len("4471-KX")
    assert "4471-KX" in with_recall.messages[0]["content"]


def test_the_model_recalls_through_history_search(api, owner, fake_llm, settings):
    settings.CHAT_CONTEXT_RECALL = True  # on, yet unused: this agent's model can search
    agent = AgentFactory(owner=owner)
    assert "history_search" in [t.name for t in tools_enabled_for(config=agent.config_json)]
    session, planted = _archived(owner, fake_llm, agent=agent)
    fake_llm.script(
        {"tool_calls": [{"name": "history_search", "arguments": {"query": "door code"}}]},
        {"quote": "door code is"},
    )
    _send(api, session, "What was the door code I gave you?")
    rows = list(ChatMessage.objects.filter(session=session, id__gt=planted + 1).order_by("-id")[:3])
    final, result, call = rows
    assert call.tool_calls[0]["function"]["name"] == "history_search"
    assert result.role == MessageRole.TOOL and "4471-KX" in result.content
    assert f"[message {planted} · user" in result.content
    assert "4471-KX" in final.content
    first_call = next(c for c in fake_llm.calls if c.kind == "chat")
    assert recall.RECALL_HEADING not in first_call.body["messages"][0]["content"]


def test_history_search_only_reads_what_is_summarised_and_only_the_owners(
    owner, outsider, fake_llm
):
    agent = AgentFactory(owner=owner)
    session, _ = _archived(owner, fake_llm, agent=agent)
    enabled = {t.name: t for t in tools_enabled_for(config=agent.config_json)}

    def run(arguments, *, user_id=owner.pk, session_id=session.pk):
        call = {"function": {"name": "history_search", "arguments": arguments}}
        context = ToolContext(agent_id=agent.pk, session_id=session_id, user_id=user_id)
        return tool_run(tool_call=call, context=context, enabled=enabled)

    text, error = run('{"query": "spare key"}')
    assert not error and "blue pot" in text
    # A message of the verbatim tail (after the anchor) is not searched: it is in context.
    ChatMessage.objects.create(session=session, role=MessageRole.USER, content="marmalade recipe")
    text, error = run('{"query": "marmalade"}')
    assert not error and "No earlier message matches" in text
    text, _ = run('{"query": "spare key"}', user_id=outsider.pk)
    assert "blue pot" not in text
    fresh = ChatSessionFactory(owner=owner, agent=agent)
    text, _ = run('{"query": "anything"}', session_id=fresh.pk)
    assert "Nothing in this conversation has been summarised yet" in text
    for bad in ('{"query": ""}', '{"query": "x", "limit": 99}', '{"limit": 2}', "[1]"):
        text, error = run(bad)
        assert error and text.startswith("Error:"), bad


def test_recall_finds_chinese_and_stays_under_its_cap(owner, fake_llm):
    session, planted = _archived(owner, fake_llm, fact="记一下：门禁密码是 8848，快递放在前台。")
    found = recall_search(
        session_id=session.pk,
        owner_id=owner.pk,
        below_id=session.verbatim_since_message_id,
        text="门禁密码是多少？",
        max_runes=500,
    )
    assert found and found[0].message_id == planted and "8848" in found[0].text
    long_ones = recall_search(
        session_id=session.pk,
        owner_id=owner.pk,
        below_id=session.verbatim_since_message_id,
        text="question answer",
        max_runes=300,
    )
    assert sum(len(e.text) + 50 for e in long_ones) <= 300 + 50
    assert [e.message_id for e in long_ones] == sorted(e.message_id for e in long_ones)


def test_recall_terms_prefer_identifiers_and_skip_filler():
    terms = recall_terms("What did we decide about the ERR-7731 retry and the deployment plan?")
    assert terms[0] == "ERR-7731"
    assert "the" not in terms and "What" not in terms and "deployment" in terms
    assert recall_terms("门禁密码是多少") == ["门禁密", "禁密码"]
    assert len(recall_terms(" ".join(f"word{i}x" for i in range(20)))) == recall.TERMS_MAX
