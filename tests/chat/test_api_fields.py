"""Strict types on every chat route (chat/api/fields.py), as on the path ids and the agent
routes: ids and counts are integers written in ASCII digits, strings are strings. Each refusal
is a 400 `invalid` that stores nothing and calls no model. Before these fields, DRF converted:
`"session_id": "١٢"` sent to session 12, `{"content": 12}` was stored and answered, `limit=1.0`
was a limit of 1."""

from __future__ import annotations

from typing import Any

import pytest

from chat.models import ChatMessage, ChatSession
from chat.text import ascii_int
from tests.factories import AgentFactory, ChatMessageFactory, ChatSessionFactory

pytestmark = pytest.mark.django_db

ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
FULL_WIDTH = str.maketrans("0123456789", "０１２３４５６７８９")


def _disguised(number: int) -> list[Any]:
    """Forms of `number` that int() reads as it, and that are not how it is written."""
    text = str(number)
    return [
        text.translate(ARABIC_INDIC),
        text.translate(FULL_WIDTH),
        f" {text}",
        f"{text} ",
        f"{text}.0",
        float(number),
        f"+{text}",
        f"{text[0]}_{text[1:]}" if len(text) > 1 else f"0_{text}",
    ]


def _invalid(response: Any) -> dict:
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "invalid", error
    return error


def test_ascii_int_takes_only_what_prints_as_itself():
    assert ascii_int(12) == 12 and ascii_int("12") == 12 and ascii_int("-3") == -3
    for value in [*_disguised(12), True, None, "", "1e3", "0x1", "12\n", [12]]:
        assert ascii_int(value) is None, value


def test_a_send_to_a_disguised_session_id_is_refused(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    for session_id in _disguised(session.pk):
        response = api.post(
            "/api/v1/chat/send", {"session_id": session_id, "content": "hi"}, format="json"
        )
        _invalid(response)
    assert ChatMessage.objects.count() == 0 and fake_llm.count() == 0


@pytest.mark.parametrize("field", ["session_id", "message_id"])
def test_truncate_and_regenerate_take_ascii_ids_only(api, owner, fake_llm, field):
    session = ChatSessionFactory(owner=owner)
    message = ChatMessageFactory(session=session)
    ids = {"session_id": session.pk, "message_id": message.pk}
    for disguised in _disguised(ids[field]):
        body = {**ids, field: disguised}
        _invalid(api.post("/api/v1/chat/truncate", body, format="json"))
        _invalid(api.post("/api/v1/chat/regenerate", body, format="json"))
    assert ChatMessage.objects.filter(pk=message.pk).exists() and fake_llm.count() == 0


def test_query_ids_are_ascii_integers(api, owner):
    session = ChatSessionFactory(owner=owner)
    message = ChatMessageFactory(session=session)
    for disguised in _disguised(session.pk):
        if isinstance(disguised, float):
            continue  # a query string holds text only
        _invalid(api.get("/api/v1/chat/history", {"session_id": disguised}))
        _invalid(api.get("/api/v1/chat/history/turns", {"session_id": disguised}))
        _invalid(api.get("/api/v1/chat/search", {"q": "message", "session_id": disguised}))
    for disguised in _disguised(message.pk):
        if not isinstance(disguised, float):
            query = {"session_id": session.pk, "around": disguised}
            _invalid(api.get("/api/v1/chat/history", query))


def test_an_agent_id_in_a_new_session_is_an_ascii_integer(api, owner):
    agent = AgentFactory(owner=owner)
    for disguised in _disguised(agent.pk):
        response = api.post("/api/v1/chat/sessions", {"agent_id": disguised}, format="json")
        _invalid(response)
    assert ChatSession.objects.count() == 0


@pytest.mark.parametrize("value", [12, 1.5, True, ["a"], {"a": 1}])
def test_titles_are_strings(api, owner, value):
    _invalid(api.post("/api/v1/chat/sessions", {"title": value}, format="json"))
    assert ChatSession.objects.count() == 0
    session = ChatSessionFactory(owner=owner, title="kept")
    _invalid(api.patch(f"/api/v1/chat/sessions/{session.pk}", {"title": value}, format="json"))
    session.refresh_from_db()
    assert session.title == "kept"


@pytest.mark.parametrize("field", ["content", "client_id"])
@pytest.mark.parametrize("value", [12, 0, 1.5, True, ["hi"]])
def test_send_strings_are_strings_and_the_model_is_not_called(api, owner, fake_llm, field, value):
    session = ChatSessionFactory(owner=owner)
    body = {"session_id": session.pk, "content": "hi", "client_id": "c-1", field: value}
    _invalid(api.post("/api/v1/chat/send", body, format="json"))
    assert ChatMessage.objects.count() == 0 and fake_llm.count() == 0


def test_compaction_instructions_are_a_string(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    response = api.post(
        f"/api/v1/chat/sessions/{session.pk}/compact", {"instructions": 12}, format="json"
    )
    _invalid(response)
    assert fake_llm.count() == 0


@pytest.mark.parametrize("value", ["1.0", " 1", "١", "１", "1 ", "+1", "1e0"])
def test_counts_in_query_strings_are_ascii_integers(api, owner, value):
    session = ChatSessionFactory(owner=owner)
    agent = AgentFactory(owner=owner)
    for path, query in [
        ("/api/v1/chat/sessions", {"limit": value}),
        ("/api/v1/chat/history", {"session_id": session.pk, "limit": value}),
        ("/api/v1/chat/history/turns", {"session_id": session.pk, "limit": value}),
        ("/api/v1/chat/search", {"q": "abc", "limit": value}),
        (f"/api/v1/chat/sessions/{session.pk}/snapshots", {"limit": value}),
        (f"/api/v1/chat/sessions/{session.pk}/snapshots", {"before": value}),
        (f"/api/v1/chat/sessions/{session.pk}/context", {"snapshots_limit": value}),
        (f"/api/v1/agents/{agent.pk}/memory/entries", {"limit": value}),
    ]:
        _invalid(api.get(path, query))


@pytest.mark.django_db(transaction=True)
def test_plain_integers_and_digit_strings_still_work(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    assert api.get("/api/v1/chat/sessions", {"limit": "1"}).status_code == 200
    assert api.get("/api/v1/chat/history", {"session_id": str(session.pk)}).status_code == 200
    response = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "hi"}, format="json"
    )
    assert response.status_code == 200, response.content[:300]
    assert ChatMessage.objects.filter(session=session).count() == 2


@pytest.mark.parametrize("tags", [[12], [True], [["a"]]])
def test_memory_entry_tags_are_strings(api, owner, tags, tmp_path, settings):
    settings.RUNTIME_DIR = tmp_path
    agent = AgentFactory(owner=owner)
    response = api.post(
        f"/api/v1/agents/{agent.pk}/memory/entries", {"content": "x", "tags": tags}, format="json"
    )
    _invalid(response)
