"""An answer with nothing in it is never stored as a complete reply (chat/turn/generate.py,
issue 25): after a payload near the model's window it is an overflow, recovered from as one
(learn the window, compact, retry); otherwise the reply fails with its own error. And a stream
that overflowed without a word is asked again unstreamed, whose refusal states the window."""

from __future__ import annotations

import pytest

from cadau.contextconfig import ContextConfig
from chat.llm import window
from chat.llm.openai_compat import OpenAICompatProvider
from chat.models import ChatMessage, MessageRole, MessageStatus
from devtools.introspect import tokens_factors
from tests.factories import ChatSessionFactory, make_conversation
from tests.helpers import send_streaming

pytestmark = pytest.mark.django_db(transaction=True)


def _send(api, session, content: str) -> dict:
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": content}, format="json")
    assert r.status_code == 200, r.content
    return r.json()["assistant_message"]


def _no_models_route(monkeypatch):
    """A server that states no window up front (llama-cpp-python): only overflows teach it."""

    def refuse(self):
        raise RuntimeError("404 Not Found")

    monkeypatch.setattr(OpenAICompatProvider, "models_listing", refuse)


def test_an_empty_answer_far_from_any_window_is_a_failed_reply(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    fake_llm.fail_next("empty", target="chat")
    events = send_streaming(api, session, "hello there")
    error = next(e for e in events if e["type"] == "error")
    assert error["code"] == "llm_empty_reply"
    assert "nothing" in error["message"]
    reply = ChatMessage.objects.get(pk=events[-1]["message"]["id"])
    assert reply.status == MessageStatus.FAILED
    assert reply.metadata["error_code"] == "llm_empty_reply"
    assert fake_llm.count("chat") == 1  # not taken for an overflow: no probe, no retry
    # The session goes on.
    assert _send(api, session, "again")["status"] == MessageStatus.COMPLETE


def test_whitespace_is_an_empty_answer_too(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    fake_llm.script("  \n ")
    reply = _send(api, session, "hello")
    assert reply["status"] == MessageStatus.FAILED
    assert reply["metadata"]["error_code"] == "llm_empty_reply"


def test_an_empty_answer_to_a_payload_near_the_window_is_an_overflow(
    api, owner, fake_llm, settings
):
    """llama-cpp-python answers a prompt that leaves no room with an empty "stop": the send
    learns a smaller window, compacts and asks again, and the reply comes."""
    # Not compacted before the send: the payload goes out at ~75% of the 750 tokens the
    # window leaves the prompt (by the estimate).
    settings.CHAT_CONTEXT = ContextConfig(
        input_budget_runes=48_000, window_tokens=1000, threshold_pct=100
    )
    # llama-cpp-python's streams carry no usage: the estimate is what there is to go by.
    fake_llm.configure(usage=False)
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=5, words=20)
    fake_llm.fail_next("empty", target="chat")
    reply = _send(api, session, "what did I say about question 3?")
    assert reply["status"] == MessageStatus.COMPLETE, reply["metadata"]
    assert reply["content"].startswith("Echo:")
    learned = window.window_learned_get(model="fake-chat")
    assert learned is not None and learned < 1000
    # The retry was built for the window learned, and smaller than the payload refused.
    chats = [c for c in fake_llm.calls if c.kind == "chat" and c.body.get("stream")]
    assert len(chats) == 2
    sizes = [sum(len(m.get("content") or "") for m in c.body["messages"]) for c in chats]
    assert sizes[1] < sizes[0]
    # The prompt was asked again unstreamed, for one token: a server whose streams say
    # nothing of usage or the window may say it there.
    probes = [c for c in fake_llm.calls if c.kind == "chat" and not c.body.get("stream")]
    assert [p.body.get("max_tokens") for p in probes] == [1]


def test_an_empty_answer_with_no_window_known_is_not_taken_for_an_overflow(api, owner, fake_llm):
    """Nothing says the prompt was near a window: learning one from it would shrink every later
    payload for nothing."""
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=3)
    fake_llm.fail_next("length", target="chat", after_tokens=0)
    reply = _send(api, session, "hello")
    assert reply["status"] == MessageStatus.FAILED
    assert reply["metadata"]["error_code"] == "llm_empty_reply"
    assert window.window_learned_get(model="fake-chat") is None


def test_a_stream_that_overflowed_silently_is_asked_again_for_the_window(
    api, owner, fake_llm, monkeypatch
):
    """A llama-cpp-python stream over the window ends before its first event and says nothing
    of the window; the same prompt unstreamed is refused with both figures, so the window is
    learned exactly (not guessed at 0.8 of our estimate) and the tokenizer with it."""
    _no_models_route(monkeypatch)
    fake_llm.configure(context_window=900)
    session = ChatSessionFactory(owner=owner)
    make_conversation(session, turns=20, words=25)  # ~1,300 tokens by the fake's count
    reply = _send(api, session, "and now?")
    assert reply["status"] == MessageStatus.COMPLETE, reply["metadata"]
    assert window.window_learned_get(model="fake-chat") == 900
    # The fake counts 4 characters a token; our guess is 3: learned from the refusal.
    assert tokens_factors(model="fake-chat")["other"] == pytest.approx(0.75, abs=0.08)
    assert ChatMessage.objects.filter(session=session, role=MessageRole.ASSISTANT).count() == 21


def test_tool_calls_alone_where_no_tools_were_offered_are_an_empty_reply(api, owner, fake_llm):
    # A plain chat offers no tools: calls alone are an answer with nothing in it for the user
    # (a probe found it stored as a complete, empty reply).
    session = ChatSessionFactory(owner=owner)
    fake_llm.script(
        {"content": "", "tool_calls": [{"name": "workspace_list", "arguments": {}}]},
        {"content": "", "tool_calls": [{"name": "workspace_list", "arguments": {}}]},
    )
    events = send_streaming(api, session, "hello there")
    error = next(e for e in events if e["type"] == "error")
    assert error["code"] == "llm_empty_reply"
    reply = ChatMessage.objects.get(pk=events[-1]["message"]["id"])
    assert reply.status == MessageStatus.FAILED and reply.content == ""
