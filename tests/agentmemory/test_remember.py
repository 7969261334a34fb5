"""Becoming memory in the chat: "remember ..." / "记住..." detected server-side (no false positive
on recalling questions), the `memory` event, long-term memory in the system prompt under its
rune cap, and memory_auto_append."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agentmemory import store
from agentmemory.hooks import MEMORY_PROMPT_HEADING, memory_system_prompt
from agentmemory.remember import remember_request
from tests.factories import AgentFactory, ChatSessionFactory
from tests.helpers import send_streaming


@pytest.mark.parametrize(
    ("text", "fact"),
    [
        ("Remember that my cat is called Miso.", "my cat is called Miso."),
        (
            "please remember: the deploy key lives in vault/prod",
            "the deploy key lives in vault/prod",
        ),
        ("Don't forget I'm allergic to peanuts", "I'm allergic to peanuts"),
        ("dont forget, standup is at 9:30", "standup is at 9:30"),
        ("Thanks! Also, remember my birthday is May 3.", "my birthday is May 3."),
        ("Remember to call me Sam from now on", "to call me Sam from now on"),
        ("记住我喜欢喝绿茶", "我喜欢喝绿茶"),
        ("请记住：项目代号是青鸟", "项目代号是青鸟"),
        ("别忘了周五要交报告。", "周五要交报告。"),
        ("好的。不要忘记我的生日是五月三号", "我的生日是五月三号"),
    ],
)
def test_remember_requests_are_detected(text, fact):
    assert remember_request(text) == fact


@pytest.mark.parametrize(
    "text",
    [
        "Do you remember when we talked about Rust?",
        "do you remember what I said",
        "Remember when we went to Lyon?",
        "I remember the old API",
        "Can you remember my name?",
        "remember?",
        "Remember me?",
        "What did I ask you to remember?",
        "The word remember is a verb.",
        "你还记得我们上次聊的吗",
        "你记住了吗？",
        "记住了吗",
        "我记住了",
        "",
    ],
)
def test_no_false_positives(text):
    assert remember_request(text) is None


@pytest.mark.django_db(transaction=True)
def test_remember_in_chat_stores_announces_and_injects(api, owner, fake_llm, runtime):
    agent = AgentFactory(owner=owner, config_json={"tools": []})
    session = ChatSessionFactory(owner=owner, agent=agent)
    events = send_streaming(api, session, "记住：我的猫叫 Miso")
    memory = [e for e in events if e["type"] == "memory"]
    assert len(memory) == 1
    event = memory[0]
    assert event["action"] == "remembered" and event["created"] is True
    assert event["entry"]["content"] == "我的猫叫 Miso"
    assert event["entry"]["source_session_id"] == session.pk
    assert event["entry"]["source_message_id"] == event["message_id"]
    # the reply generated for that very message already had it in its system prompt
    system = fake_llm.calls[-1].body["messages"][0]["content"]
    assert MEMORY_PROMPT_HEADING in system and "我的猫叫 Miso" in system

    # a question about it is not stored again, and the memory is injected
    events = send_streaming(api, session, "Do you remember what my cat is called?")
    assert not [e for e in events if e["type"] == "memory"]
    assert len(store.entry_list(agent_id=agent.pk)) == 1
    assert "Miso" in fake_llm.calls[-1].body["messages"][0]["content"]


@pytest.mark.django_db(transaction=True)
def test_plain_sessions_have_no_memory(api, owner, fake_llm, runtime):
    session = ChatSessionFactory(owner=owner)
    events = send_streaming(api, session, "Remember that I like tea.")
    assert not [e for e in events if e["type"] == "memory"]
    assert not any(runtime.iterdir())


@pytest.mark.django_db
def test_memory_prompt_respects_cap_and_relevance(runtime, owner):
    agent = AgentFactory(owner=owner, config_json={"memory_prompt_runes": 400})
    session = ChatSessionFactory(owner=owner, agent=agent)
    store.entry_write(agent_id=agent.pk, name=None, content="The user's dog is named Rex.")
    for i in range(30):
        store.entry_write(agent_id=agent.pk, name=None, content=f"Filler fact {i} about trains")
    text = memory_system_prompt(session=session, query="what is my dog called")
    assert len(text) <= 400
    listing = text.split("\n\n", 1)[1]
    assert listing.splitlines()[0] == "- The user's dog is named Rex."  # most relevant first
    agent.config_json = {"memory_prompt_runes": 0}
    assert memory_system_prompt(session=session, query="dog") == ""


@pytest.mark.django_db(transaction=True)
def test_memory_auto_append_writes_every_turn(api, owner, fake_llm, runtime):
    agent = AgentFactory(owner=owner, config_json={"memory_auto_append": True, "tools": []})
    session = ChatSessionFactory(owner=owner, agent=agent)
    fake_llm.script("Paris is the capital.")
    r = api.post(
        "/api/v1/chat/send",
        {"session_id": session.pk, "content": "capital of France?"},
        format="json",
    )
    assert r.status_code == 200
    note = store.daily_note_read(agent_id=agent.pk, day=timezone.localdate())
    assert "capital of France?" in note and "Paris is the capital." in note

    other = AgentFactory(owner=owner, config_json={"tools": []})
    quiet = ChatSessionFactory(owner=owner, agent=other)
    api.post("/api/v1/chat/send", {"session_id": quiet.pk, "content": "hi"}, format="json")
    assert store.daily_note_read(agent_id=other.pk, day=timezone.localdate()) == ""
