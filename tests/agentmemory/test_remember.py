"""Becoming memory in the chat: "remember ..." / "记住..." detected server-side (no false positive
on recalling questions), the `memory` event, long-term memory in the system prompt under its
rune cap, and memory_auto_append."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agentmemory import store
from agentmemory.hooks import MEMORY_PROMPT_HEADING
from agentmemory.remember import remember_parse, remember_request, remember_resolve
from tests.factories import AgentFactory, ChatSessionFactory
from tests.helpers import memory_system_prompt, send_streaming

# (message, the fact stored). English and Chinese, the imperative and the request said as a
# wish, with openers, politeness and punctuation varied.
REQUESTS = [
    ("Remember that my cat is called Miso.", "my cat is called Miso."),
    ("please remember: the deploy key lives in vault/prod", "the deploy key lives in vault/prod"),
    ("Don't forget I'm allergic to peanuts", "I'm allergic to peanuts"),
    ("dont forget, standup is at 9:30", "standup is at 9:30"),
    ("Thanks! Also, remember my birthday is May 3.", "my birthday is May 3."),
    ("Remember to call me Sam from now on", "to call me Sam from now on"),
    ("Okay, remember this: the staging DB is db-2.", "the staging DB is db-2."),
    ("Please always remember I prefer metric units", "I prefer metric units"),
    ("Never forget that prod deploys need two approvals", "prod deploys need two approvals"),
    ("Make a note: the wifi password is hunter2", "the wifi password is hunter2"),
    ("I want you to remember that I'm vegetarian.", "I'm vegetarian."),
    ("I'd like you to remember my son's name is Leo", "my son's name is Leo"),
    ("I need you to remember: invoices go to ap@example.com", "invoices go to ap@example.com"),
    ("Do not forget the meeting moved to 3pm", "the meeting moved to 3pm"),
    ("记住我喜欢喝绿茶", "我喜欢喝绿茶"),
    ("请记住：项目代号是青鸟", "项目代号是青鸟"),
    ("别忘了周五要交报告。", "周五要交报告。"),
    ("好的。不要忘记我的生日是五月三号", "我的生日是五月三号"),
    # The phrasings issue 17 named.
    ("请你记住我的邮箱是 a@b.cn", "我的邮箱是 a@b.cn"),
    ("请你记住，我下周二出差。", "我下周二出差。"),
    ("你记住：服务器地址是 10.0.0.8", "服务器地址是 10.0.0.8"),
    ("你记住，我不吃香菜", "我不吃香菜"),
    ("好的，记住我的车牌是沪A12345", "我的车牌是沪A12345"),
    ("好，记住：会议改到三点", "会议改到三点"),
    ("我希望你记住我是素食者", "我是素食者"),
    ("我希望你记住：报告要用中文写。", "报告要用中文写。"),
    ("我希望你能记住我女儿叫小雨", "我女儿叫小雨"),
    # More of the same family.
    ("请您记住，发票抬头是青鸟科技", "发票抬头是青鸟科技"),
    ("麻烦你记住我的工号 8812", "我的工号 8812"),
    ("对了，记住我住在杭州", "我住在杭州"),
    ("谢谢！另外，请记住我周末不看消息", "我周末不看消息"),
    ("你一定要记住密钥放在 /etc/app/key", "密钥放在 /etc/app/key"),
    ("务必记住：上线前先备份数据库", "上线前先备份数据库"),
    ("帮我记下来：明天九点开会", "明天九点开会"),
    ("记住了，明天八点出发", "明天八点出发"),
    ("千万别忘了给妈妈打电话", "给妈妈打电话"),
    ("我想让你记住我的名字是王芳", "我的名字是王芳"),
    ("嗯，你要记住我对花生过敏", "我对花生过敏"),
]

NOT_REQUESTS = [
    "Do you remember when we talked about Rust?",
    "do you remember what I said",
    "Remember when we went to Lyon?",
    "I remember the old API",
    "Can you remember my name?",
    "remember?",
    "Remember me?",
    "What did I ask you to remember?",
    "The word remember is a verb.",
    "I want you to remember when we met.",
    "Do you still remember my address?",
    "I forgot my keys again",
    "She told me to remember the milk",
    "Remember how we fixed it last time?",
    "你还记得我们上次聊的吗",
    "你还记得我的生日吗？",
    "你还记得我叫什么",
    "你记住了吗？",
    "你记住了吗",
    "记住了吗",
    "我记住了",
    "我记住了你的名字",
    "你记住了我的名字",
    "你记住没有",
    "你能记住我的生日吗？",
    "他记住了所有的电话号码。",
    "我总是记不住别人的名字",
    "请记住",
    "好的，记住",
    "我希望你记住了",
    "你记得带伞吗",
    "",
]


@pytest.mark.parametrize(("text", "fact"), REQUESTS)
def test_remember_requests_are_detected(text, fact):
    assert remember_request(text) == fact


@pytest.mark.parametrize("text", NOT_REQUESTS)
def test_no_false_positives(text):
    assert remember_request(text) is None


# (the user's earlier messages, newest first; the message asking; what is stored). A request
# that only points at something ("my name", "that") stores what it points at (issue 25:
# "remember my name" after "I am Marguerite Okonkwo-Hale" stored "my name.").
REFERENCES = [
    (["I am Marguerite Okonkwo-Hale"], "remember my name", "My name is Marguerite Okonkwo-Hale."),
    ([], "I'm Jean de la Fontaine. Please remember my name.", "My name is Jean de la Fontaine."),
    (["Hi! My name is Sam Lee, nice to meet you."], "Remember my name!", "My name is Sam Lee."),
    (["call me Ada", "what is 2+2?"], "don't forget my name", "My name is Ada."),
    (["我叫王芳。"], "请记住我的名字", "我的名字是王芳"),
    (
        ["My flight leaves at 8:15 on Friday.", "hello"],
        "remember that",
        "My flight leaves at 8:15 on Friday.",
    ),
    (
        ["What time is it?", "The router password is swordfish."],
        "remember it.",
        "The router password is swordfish.",
    ),
    ([], "The staging DB is db-2. Remember this.", "The staging DB is db-2."),
    (["项目代号是青鸟。"], "记住这个", "项目代号是青鸟。"),
    (
        ["By the way, my birthday is May 3. See you."],
        "remember my birthday",
        "By the way, my birthday is May 3.",
    ),
    (["我的生日是五月三号。"], "记住我的生日", "我的生日是五月三号。"),
]


@pytest.mark.parametrize(("earlier", "text", "fact"), REFERENCES)
def test_a_request_that_points_at_what_was_said_stores_what_it_points_at(earlier, text, fact):
    ask = remember_parse(text)
    assert ask is not None
    assert remember_resolve(ask, earlier=lambda: earlier) == fact


def test_a_reference_that_finds_nothing_stores_nothing_and_a_fact_is_not_looked_up():
    assert (
        remember_resolve(remember_parse("remember my name"), earlier=lambda: ["I am tired"]) is None
    )
    assert remember_resolve(remember_parse("remember that"), earlier=lambda: ["what now?"]) is None
    # A thing pointed at but never said is kept as said, as before.
    assert remember_resolve(remember_parse("remember my shoe size"), earlier=list) == "my shoe size"

    def never() -> list[str]:
        raise AssertionError("a fact said outright needs no look-up")

    assert remember_resolve(remember_parse("remember my cat is called Miso"), earlier=never) == (
        "my cat is called Miso"
    )


@pytest.mark.django_db(transaction=True)
def test_remember_my_name_in_chat_stores_the_name(api, owner, fake_llm, runtime):
    agent = AgentFactory(owner=owner, config_json={"tools": []})
    session = ChatSessionFactory(owner=owner, agent=agent)
    send_streaming(api, session, "I am Marguerite Okonkwo-Hale")
    events = send_streaming(api, session, "remember my name")
    memory = [e for e in events if e["type"] == "memory"]
    assert [e["entry"]["content"] for e in memory] == ["My name is Marguerite Okonkwo-Hale."]
    assert [e.content for e in store.entry_list(agent_id=agent.pk)] == [
        "My name is Marguerite Okonkwo-Hale."
    ]
    # Only this session's own messages are looked in: a new one has no name to point at.
    fresh = ChatSessionFactory(owner=owner, agent=agent)
    events = send_streaming(api, fresh, "remember my name")
    assert not [e for e in events if e["type"] == "memory"]
    assert len(store.entry_list(agent_id=agent.pk)) == 1


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


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stream", [False, True])
def test_an_agent_send_reads_the_memory_entries_once(
    api, owner, fake_llm, runtime, monkeypatch, stream
):
    """The checks, the payload, the `done` budget and the response all use one load."""
    agent = AgentFactory(owner=owner)
    session = ChatSessionFactory(owner=owner, agent=agent)
    store.entry_write(agent_id=agent.pk, name=None, content="The user's dog is called Rex.")
    loads = []
    entry_list = store.entry_list
    monkeypatch.setattr(store, "entry_list", lambda **kw: loads.append(kw) or entry_list(**kw))
    fake_llm.script("Rex is a good name.")
    if stream:
        events = send_streaming(api, session, "what is my dog called?")
        assert events[-1]["type"] == "done"
    else:
        body = {"session_id": session.pk, "content": "what is my dog called?"}
        assert api.post("/api/v1/chat/send", body, format="json").status_code == 200
    assert len(loads) == 1
    assert "Rex" in fake_llm.calls[-1].body["messages"][0]["content"]
