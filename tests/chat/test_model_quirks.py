"""What real OpenAI-compatible servers do that a send must survive (issue 13, "server quirks"):
thinking output, replies cut by the token limit or by another request, tools refused. Each
runs a real send through the fake server, which reproduces the shape (devtools/fakellm)."""

from __future__ import annotations

import pytest

from chat.models import ChatMessage
from tests.factories import AgentFactory, ChatSessionFactory
from tests.helpers import send_streaming

pytestmark = pytest.mark.django_db(transaction=True)


def _send(api, session, content: str) -> dict:
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": content}, format="json")
    assert r.status_code == 200, r.content
    return r.json()["assistant_message"]


def test_a_think_block_is_neither_streamed_nor_stored(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    fake_llm.fail_next("think_tags", message="The user greets me. I will greet back.")
    fake_llm.script("Hello!")
    events = send_streaming(api, session, "hi")
    streamed = "".join(e["text"] for e in events if e["type"] == "delta")
    assert streamed == "Hello!"
    reply = ChatMessage.objects.get(pk=events[-1]["message"]["id"])
    assert reply.content == "Hello!" and reply.status == "complete"
    # The next call's history carries the answer only, not the reasoning.
    fake_llm.script("ok")
    _send(api, session, "again")
    history = fake_llm.calls[-1].body["messages"]
    assert all("greet back" not in (m.get("content") or "") for m in history)


def test_reasoning_content_is_not_stored(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    fake_llm.script({"content": "Paris.", "reasoning": "France's capital is Paris."})
    reply = _send(api, session, "capital of France?")
    assert reply["content"] == "Paris."


def test_a_reply_cut_by_the_token_limit_is_kept_and_marked(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    fake_llm.fail_next("length", after_tokens=3)
    fake_llm.script("one two three four five six")
    reply = _send(api, session, "count")
    assert reply["status"] == "complete"
    assert reply["content"] == "one two three "  # the fake's tokens are words with their space
    assert reply["metadata"]["cut"] == "length"
    assert reply["metadata"]["finish_reason"] == "length"
    fake_llm.script("fine")
    assert "cut" not in _send(api, session, "next")["metadata"]


def test_a_reply_interrupted_by_another_request_is_marked(api, owner, fake_llm):
    """llama-cpp-python ends a running stream with [DONE] and no finish_reason when a newer
    request arrives (its default --interrupt_requests)."""
    session = ChatSessionFactory(owner=owner)
    fake_llm.fail_next("interrupted", after_tokens=2)
    fake_llm.script("alpha beta gamma")
    reply = _send(api, session, "go")
    assert reply["content"] == "alpha beta "
    assert reply["metadata"]["cut"] == "interrupted"


def test_an_agent_on_a_server_without_tools_still_answers(api, owner, fake_llm):
    fake_llm.configure(reject_tools=True)
    agent = AgentFactory(owner=owner)
    session = ChatSessionFactory(owner=owner, agent=agent)
    fake_llm.script("No tools here, but an answer.")
    reply = _send(api, session, "what time is it?")
    assert reply["content"] == "No tools here, but an answer."
    bodies = [c.body for c in fake_llm.calls if c.kind == "chat"]
    assert bodies[0].get("tools") and "tools" not in bodies[-1]


def _over_threshold(owner):
    from tests.factories import make_conversation

    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=12, words=12)
    return session


SMALL = dict(input_budget_runes=3000, threshold_pct=80, target_pct=50, summary_max_runes=500)


@pytest.mark.parametrize("slots", [1, 0])
def test_on_a_one_slot_server_the_background_summary_waits_for_the_reply(
    api, owner, fake_llm, settings, slots
):
    """A send over the threshold compacts in the background. On a one-slot server
    (LLM_SERVER_SLOTS=1) the summary goes after the reply, not beside it; otherwise at once."""
    from cadau.contextconfig import ContextConfig
    from chat.models import ContextSnapshot
    from devtools.introspect import background_wait

    settings.CHAT_CONTEXT = ContextConfig(**SMALL)
    settings.LLM_SERVER_SLOTS = slots
    settings.CHAT_BACKGROUND_COMPACTION = True
    fake_llm.configure(token_ms=15)
    session = _over_threshold(owner)
    fake_llm.script(" ".join(f"w{i}" for i in range(30)))  # ~0.45 s of streaming
    reply = _send(api, session, "a question that tips it over")
    assert reply["status"] == "complete"
    background_wait(timeout=30)
    assert ContextSnapshot.objects.filter(session=session, outcome="committed").exists()
    chat = next(c for c in fake_llm.calls if c.kind == "chat")
    summary = next(c for c in fake_llm.calls if c.kind == "summary")
    if slots == 1:
        assert summary.received_at >= chat.received_at + 0.4  # after the reply streamed
    else:
        assert summary.received_at < chat.received_at + 0.4  # beside it
