"""/api/v1/agents/{id}/memory/...: daily notes, entries (list, search, create with dedup, the
"Remember" action on a message, read, delete), name safety, ownership, another storage backend."""

from __future__ import annotations

from datetime import date

import pytest
from django.utils import timezone

from agentmemory import store
from tests.factories import AgentFactory, ChatMessageFactory, ChatSessionFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(runtime, owner):
    return AgentFactory(owner=owner)


def _base(agent) -> str:
    return f"/api/v1/agents/{agent.pk}/memory"


def test_entries_create_list_search_read_delete(api, agent):
    r = api.post(
        f"{_base(agent)}/entries", {"content": "The user prefers green tea."}, format="json"
    )
    assert r.status_code == 201, r.content
    entry = r.json()
    assert set(entry) == {
        "name",
        "title",
        "content",
        "tags",
        "created",
        "updated",
        "source_session_id",
        "source_message_id",
    }
    assert entry["name"] == "the-user-prefers-green-tea"
    assert entry["title"] == "The user prefers green tea."
    # the same fact again updates instead of repeating
    again = api.post(
        f"{_base(agent)}/entries", {"content": "the user prefers green tea"}, format="json"
    )
    assert again.status_code == 200 and again.json()["name"] == entry["name"]
    api.post(f"{_base(agent)}/entries", {"content": "Deploys happen on Fridays."}, format="json")

    listed = api.get(f"{_base(agent)}/entries").json()["results"]
    assert len(listed) == 2
    found = api.get(f"{_base(agent)}/entries", {"q": "tea"}).json()["results"]
    assert [e["name"] for e in found] == [entry["name"]]

    one = api.get(f"{_base(agent)}/entries/{entry['name']}")
    assert one.status_code == 200 and one.json()["content"] == "the user prefers green tea"
    assert api.delete(f"{_base(agent)}/entries/{entry['name']}").status_code == 204
    assert api.get(f"{_base(agent)}/entries/{entry['name']}").status_code == 404
    assert api.delete(f"{_base(agent)}/entries/{entry['name']}").status_code == 404


def test_remember_action_on_a_message(api, owner, agent):
    session = ChatSessionFactory(owner=owner, agent=agent)
    message = ChatMessageFactory(session=session, content="My flight is LH 1234 on May 3.")
    r = api.post(f"{_base(agent)}/entries", {"source_message_id": message.pk}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["content"] == "My flight is LH 1234 on May 3."
    assert (body["source_session_id"], body["source_message_id"]) == (session.pk, message.pk)
    assert "remembered" in body["tags"]


def test_source_message_must_be_mine_and_this_agents(api, owner, outsider, agent):
    other_agent = AgentFactory(owner=owner)
    wrong_agent_msg = ChatMessageFactory(
        session=ChatSessionFactory(owner=owner, agent=other_agent), content="x"
    )
    plain_msg = ChatMessageFactory(session=ChatSessionFactory(owner=owner), content="x")
    foreign = ChatMessageFactory(
        session=ChatSessionFactory(owner=outsider, agent=agent), content="x"
    )
    for message_id in (wrong_agent_msg.pk, plain_msg.pk, foreign.pk, 10**12):
        r = api.post(
            f"{_base(agent)}/entries",
            {"content": "c", "source_message_id": message_id},
            format="json",
        )
        assert r.status_code == 404, message_id
    assert store.entry_list(agent_id=agent.pk) == []


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"content": ""},
        {"content": "   "},
        {"content": 5},
        {"source_message_id": "abc"},
        {"source_message_id": "1"},  # an id in a body is a JSON integer
        {"content": "ok", "unknown": 1},  # a field the route does not take
        {"content": "x" * (store.ENTRY_MAX_CHARS + 1)},
        {"content": "ok", "tags": "t"},
        # Tags the entry's file cannot hold: refused, not dropped from what was asked.
        {"content": "ok", "tags": ["a]\ncreated: 1999\nx: [b"]},
        {"content": "ok", "tags": ["two words"]},
        {"content": "ok", "tags": [""]},
        {"content": "ok", "tags": ["x" * 41]},
        # 20 would push out the `remembered` every created entry gets.
        {"content": "ok", "tags": [f"t{i}" for i in range(20)]},
    ],
)
def test_bad_entry_bodies_are_400(api, agent, payload):
    r = api.post(f"{_base(agent)}/entries", payload, format="json")
    assert r.status_code == 400, r.content
    assert "error" in r.json()
    assert api.get(f"{_base(agent)}/entries").json()["results"] == []


@pytest.mark.parametrize("name", ["Bad.Name", "..", "a b", "%2e%2e", "ÄBC", "x" * 200, ".hidden"])
def test_unsafe_entry_names_are_400(api, agent, name):
    r = api.get(f"{_base(agent)}/entries/{name}")
    assert r.status_code == 400, (name, r.content)
    assert r.json()["error"]["code"] == "invalid_name"
    assert api.delete(f"{_base(agent)}/entries/{name}").status_code == 400


def test_daily_note(api, agent):
    day = date(2025, 3, 4)
    store.daily_note_append(agent_id=agent.pk, day=day, heading="Note", body="hello")
    r = api.get(f"{_base(agent)}/daily", {"date": "2025-03-04"})
    assert r.status_code == 200
    body = r.json()
    assert body["date"] == "2025-03-04"
    assert "## Note" in body["markdown"] and "hello" in body["markdown"]
    assert body["days"] == ["2025-03-04"]
    today = api.get(f"{_base(agent)}/daily").json()
    assert today["date"] == timezone.localdate().isoformat() and today["markdown"] == ""
    for bad in ("2025-13-01", "yesterday", "2025-3-4x"):
        assert api.get(f"{_base(agent)}/daily", {"date": bad}).status_code == 400


def test_daily_note_html_is_the_sanitised_markdown_without_bookkeeping(api, agent):
    day = date(2025, 3, 5)
    body = (
        "<!-- cadau:flush session=3 messages=10-11 -->\n\n"
        "**user** (#10): plan **Porto** <script>alert(1)</script>\n\n"
        "**assistant** (#11): - [x] done"
    )
    store.daily_note_append(agent_id=agent.pk, day=day, heading="Turn · 10:00", body=body)
    note = api.get(f"{_base(agent)}/daily", {"date": "2025-03-05"}).json()
    assert "(#10)" in note["markdown"] and "cadau:flush" in note["markdown"]  # the file as is
    html = note["html"]
    assert "<h2>Turn · 10:00</h2>" in html
    assert "<strong>user</strong>: plan <strong>Porto</strong>" in html
    assert "(#10)" not in html and "(#11)" not in html and "cadau:flush" not in html
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_an_entry_is_titled_in_its_own_words_while_its_file_name_stays_ascii(api, agent):
    # The model named it in English (memory_write's `name`); the user wrote Chinese.
    porto = "计划波尔图周末：\n周六去里贝拉区"
    store.entry_write(agent_id=agent.pk, name="plan-a-weekend-in-porto", content=porto)
    tea = {"content": "# 用户喜欢喝绿茶，不加糖"}
    made = api.post(f"{_base(agent)}/entries", tea, format="json")
    assert made.status_code == 201
    assert made.json()["title"] == "用户喜欢喝绿茶，不加糖"
    assert made.json()["name"].startswith("entry-") and made.json()["name"].isascii()
    listed = {e["name"]: e["title"] for e in api.get(f"{_base(agent)}/entries").json()["results"]}
    assert listed["plan-a-weekend-in-porto"] == "计划波尔图周末："
    long = "很长的记忆" * 30
    title = api.post(f"{_base(agent)}/entries", {"content": long}, format="json").json()["title"]
    assert title.endswith("…") and len(title) == 31  # 30 wide characters: 60 columns


def test_api_on_a_non_default_storage_backend(api, agent, settings, runtime):
    settings.AGENT_MEMORY_STORAGE = "django.core.files.storage.InMemoryStorage"
    r = api.post(f"{_base(agent)}/entries", {"content": "Stored in memory only."}, format="json")
    assert r.status_code == 201
    assert [e["content"] for e in api.get(f"{_base(agent)}/entries").json()["results"]] == [
        "Stored in memory only."
    ]
    assert not any(runtime.rglob("*.md"))  # nothing landed on disk


def test_admin_pages(client, runtime, owner):
    from django.urls import reverse

    from agentmemory.flush import memory_flush_before_compaction
    from chat.context import TailMessage
    from tests.factories import UserFactory, make_conversation

    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(root)
    agent = AgentFactory(owner=owner, config_json={"memory_auto_extract": False})
    session = ChatSessionFactory(owner=owner, agent=agent)
    rows = [TailMessage.from_row(r) for r in make_conversation(session, turns=2)]
    memory_flush_before_compaction(session=session, messages=rows)
    assert client.get(reverse("admin:agentmemory_memoryflush_changelist")).status_code == 200
    # the agent form refuses what the API refuses
    url = reverse("admin:chat_agent_change", args=[agent.pk])
    assert client.get(url).status_code == 200
    response = client.post(
        url,
        {
            "owner": owner.pk,
            "name": agent.name,
            "system_prompt": "",
            "model": "",
            "config_json": '{"bogus": 1}',
            "created_at_0": "2025-01-01",
            "created_at_1": "00:00:00",
        },
    )
    assert response.status_code == 200  # re-rendered with the error
    assert "unknown key" in response.content.decode()


def test_an_entry_is_edited_in_place(api, outsider_api, agent):
    created = api.post(
        f"{_base(agent)}/entries", {"content": "Likes tea.", "tags": ["drinks"]}, format="json"
    ).json()
    url = f"{_base(agent)}/entries/{created['name']}"
    r = api.patch(url, {"content": "Likes green tea, no sugar."}, format="json")
    assert r.status_code == 200, r.content
    edited = r.json()
    assert edited["name"] == created["name"] and edited["content"] == "Likes green tea, no sugar."
    assert edited["tags"] == created["tags"] and edited["created"] == created["created"]
    assert api.get(url).json()["content"] == "Likes green tea, no sugar."
    retagged = api.patch(url, {"content": "Likes green tea.", "tags": [" Tea "]}, format="json")
    assert retagged.json()["tags"] == ["tea"]  # as the file keeps it
    cleared = api.patch(url, {"content": "Likes green tea.", "tags": []}, format="json")
    assert cleared.json()["tags"] == []
    assert len(api.get(f"{_base(agent)}/entries").json()["results"]) == 1

    for body in (
        {},
        {"content": "   "},
        {"content": 5},
        {"content": "x", "tags": "tea"},
        {"content": "x", "tags": ["a:b"]},
    ):
        bad = api.patch(url, body, format="json")
        assert bad.status_code == 400, (body, bad.content)
    assert api.get(url).json()["content"] == "Likes green tea."
    # Editing never creates: a missing entry stays missing.
    missing = api.patch(f"{_base(agent)}/entries/no-such-entry", {"content": "x"}, format="json")
    assert missing.status_code == 404
    assert api.get(f"{_base(agent)}/entries/no-such-entry").status_code == 404
    # Another user's agent is a 404, and its entry is unchanged.
    assert outsider_api.patch(url, {"content": "hijacked"}, format="json").status_code == 404
    assert api.get(url).json()["content"] == "Likes green tea."


def test_a_created_entry_with_the_most_tags_keeps_remembered(api, agent):
    tags = [f"t{i}" for i in range(19)]
    created = api.post(f"{_base(agent)}/entries", {"content": "ok", "tags": tags}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["tags"] == [*tags, "remembered"]


def test_an_empty_date_is_refused_not_read_as_today(api, owner):
    from tests.factories import AgentFactory

    agent = AgentFactory(owner=owner)
    response = api.get(f"/api/v1/agents/{agent.pk}/memory/daily?date=")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
