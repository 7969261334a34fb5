"""A JSON body says one thing or is refused (chat/api/fields.py, chat/api/parsers.py), as a
black-box probe found it did not: an id written as a string of digits was read as the number,
a field no route takes was ignored, a key given twice kept its last value, a `charset` in the
Content-Type switched the decoding away from UTF-8, and an empty query parameter was read as
absent. Each is a 400 that stores nothing and calls no model."""

from __future__ import annotations

from typing import Any

import pytest

from chat.models import ChatMessage, ChatSession
from tests.factories import AgentFactory, ChatMessageFactory, ChatSessionFactory

pytestmark = pytest.mark.django_db


def _refused(response: Any, code: str = "invalid") -> str:
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == code, error
    return str(error["message"])


def test_ids_in_a_body_are_json_integers_not_digit_strings(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner)
    agent = AgentFactory(owner=owner)
    message = ChatMessageFactory(session=session)
    sessions = ChatSession.objects.count()
    for path, body in [
        ("/api/v1/chat/send", {"session_id": str(session.pk), "content": "hi"}),
        ("/api/v1/chat/regenerate", {"session_id": str(session.pk)}),
        ("/api/v1/chat/truncate", {"session_id": session.pk, "message_id": str(message.pk)}),
        ("/api/v1/chat/sessions", {"agent_id": str(agent.pk)}),
    ]:
        _refused(api.post(path, body, format="json"))
    assert ChatMessage.objects.count() == 1 and ChatSession.objects.count() == sessions
    assert fake_llm.count() == 0


@pytest.mark.parametrize(
    "path, body",
    [
        ("/api/v1/chat/sessions", {"titel": "typo"}),
        ("/api/v1/chat/send", {"session_id": 0, "content": "hi", "stream": True}),
        ("/api/v1/chat/regenerate", {"session_id": 0, "content": "hi"}),
        ("/api/v1/chat/truncate", {"session_id": 0, "message_id": 1, "all": True}),
    ],
)
def test_a_field_the_route_does_not_take_is_refused(api, owner, fake_llm, path, body):
    session = ChatSessionFactory(owner=owner)
    if "session_id" in body:
        body["session_id"] = session.pk
    message = _refused(api.post(path, body, format="json"))
    assert "unknown field" in message
    assert ChatSession.objects.count() == 1 and ChatMessage.objects.count() == 0
    assert fake_llm.count() == 0


def test_unknown_fields_on_update_and_compact(api, owner, fake_llm):
    session = ChatSessionFactory(owner=owner, title="kept")
    _refused(
        api.patch(f"/api/v1/chat/sessions/{session.pk}", {"title": "x", "y": 1}, format="json")
    )
    _refused(api.post(f"/api/v1/chat/sessions/{session.pk}/compact", {"a": 1}, format="json"))
    session.refresh_from_db()
    assert session.title == "kept" and fake_llm.count() == 0


def test_a_key_given_twice_is_refused(api, owner):
    response = api.post(
        "/api/v1/chat/sessions",
        data='{"title": "a", "title": "b"}',
        content_type="application/json",
    )
    assert "duplicate key 'title'" in _refused(response, "parse_error")
    assert not ChatSession.objects.exists()


def test_a_body_is_utf_8_whatever_charset_the_content_type_names(api, owner):
    session = ChatSessionFactory(owner=owner, title="kept")
    url = f"/api/v1/chat/sessions/{session.pk}"
    latin = "application/json; charset=latin-1"
    # Latin-1 bytes are not UTF-8: refused, as without the parameter.
    _refused(
        api.patch(url, data='{"title": "café"}'.encode("latin-1"), content_type=latin),
        "parse_error",
    )
    session.refresh_from_db()
    assert session.title == "kept"
    # UTF-8 bytes are read as UTF-8 (they were stored as "cafÃ©").
    response = api.patch(url, data='{"title": "café"}'.encode(), content_type=latin)
    assert response.status_code == 200 and response.json()["title"] == "café"


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/chat/sessions?limit=",
        "/api/v1/chat/history?session_id={s}&limit=",
        "/api/v1/chat/history?session_id={s}&around=",
        "/api/v1/chat/history?session_id=",
        "/api/v1/chat/history/turns?session_id={s}&limit=",
        "/api/v1/chat/search?q=hello&session_id=",
        "/api/v1/chat/search?q=hello&limit=",
        "/api/v1/chat/sessions/{s}/context?snapshots_limit=",
        "/api/v1/chat/sessions/{s}/snapshots?limit=",
    ],
)
def test_an_empty_number_in_a_query_string_is_refused_not_read_as_absent(api, owner, path):
    # `session_id=` of a search searched every session of the user's.
    session = ChatSessionFactory(owner=owner)
    _refused(api.get(path.format(s=session.pk)))


def test_digits_in_a_query_string_still_work(api, owner):
    session = ChatSessionFactory(owner=owner)
    assert api.get(f"/api/v1/chat/history?session_id={session.pk}&limit=5").status_code == 200


@pytest.mark.parametrize(
    "title",
    [
        "a\r\nSet-Cookie: x=1",
        "tab\there",
        "esc\x1b[31m",
        "a\u2028b",
        # A probe: a blank row in the list, and a name that reads backwards from U+202E on.
        "\u200b\u200b",
        "\ufeff\u180e",
        "invoice\u202etxt.exe",
        "\u3164\u3164",  # Hangul filler: the usual "blank name"
        "\u2800",
        "a\u2066b",
    ],
)
def test_a_title_or_an_agent_name_is_one_line(api, owner, title):
    session = ChatSessionFactory(owner=owner, title="kept")
    _refused(api.patch(f"/api/v1/chat/sessions/{session.pk}", {"title": title}, format="json"))
    _refused(api.post("/api/v1/chat/sessions", {"title": title}, format="json"))
    agent = AgentFactory(owner=owner, name="kept")
    _refused(api.patch(f"/api/v1/agents/{agent.pk}", {"name": title}, format="json"))
    _refused(api.post("/api/v1/agents", {"name": title}, format="json"))
    session.refresh_from_db()
    agent.refresh_from_db()
    assert session.title == "kept" and agent.name == "kept"
    assert ChatSession.objects.count() == 1


def test_names_in_any_script_and_with_inner_zero_width_joiners_are_kept(api, owner):
    for title in ("日本語のチャット", "café", "👩\u200d💻 notes", "a\u200bb"):
        response = api.post("/api/v1/chat/sessions", {"title": title}, format="json")
        assert response.status_code == 201, (title, response.content)


def test_a_null_agent_config_is_refused_not_read_as_empty(api, owner):
    agent = AgentFactory(owner=owner, config_json={"memory_auto_append": True})
    response = api.patch(f"/api/v1/agents/{agent.pk}", {"config_json": None}, format="json")
    _refused(response, "invalid_config")
    agent.refresh_from_db()
    assert agent.config_json == {"memory_auto_append": True}
    _refused(
        api.post("/api/v1/agents", {"name": "n", "config_json": None}, format="json"),
        "invalid_config",
    )
    # Not given at all: the defaults, as before.
    assert api.post("/api/v1/agents", {"name": "n"}, format="json").status_code == 201


@pytest.mark.parametrize(
    "query",
    [
        "/api/v1/chat/history?session_id={sid}&before=",
        "/api/v1/chat/history?session_id={sid}&after=",
        "/api/v1/chat/history?session_id={sid}&cursor=",
        "/api/v1/chat/history?session_id={sid}&render=",
        "/api/v1/chat/search?q=hello&role=",
        "/api/v1/chat/search?q=hello&before=",
        "/api/v1/chat/sessions?cursor=",
    ],
)
def test_a_query_parameter_given_empty_is_refused_not_read_as_absent(api, owner, query):
    """docs/api.md: a parameter given empty is not read as absent (a probe found `?before=`,
    `?render=`, `?role=`... read as absent while `?limit=` was refused)."""
    session = ChatSessionFactory(owner=owner)
    response = api.get(query.format(sid=session.pk))
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid"
