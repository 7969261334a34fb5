"""A chat's own model (ChatSession.model): chosen through PATCH /chat/sessions/{id} among the
operator's LLM_ALLOWED_MODELS, owner-checked, and used by the next send."""

from __future__ import annotations

import pytest

from chat.models import ChatSession
from tests.factories import AgentFactory, ChatSessionFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _allowed(settings):
    settings.LLM_ALLOWED_MODELS = ["fake-chat", "fake-big"]


def test_the_owner_sets_and_clears_a_chat_model(api, owner):
    session = ChatSessionFactory(owner=owner)
    r = api.patch(f"/api/v1/chat/sessions/{session.pk}", {"model": "fake-big"}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["model"] == "fake-big"
    assert ChatSession.objects.get(pk=session.pk).model == "fake-big"
    assert api.get(f"/api/v1/chat/sessions/{session.pk}").json()["model"] == "fake-big"
    cleared = api.patch(f"/api/v1/chat/sessions/{session.pk}", {"model": ""}, format="json")
    assert cleared.json()["model"] == ""
    assert api.get("/api/v1/status").json()["allowed_models"] == ["fake-chat", "fake-big"]


def test_a_model_not_allowed_is_a_clear_400_that_changes_nothing(api, owner):
    session = ChatSessionFactory(owner=owner, title="Kept")
    r = api.patch(
        f"/api/v1/chat/sessions/{session.pk}",
        {"model": "gpt-secret", "title": "Renamed"},
        format="json",
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "model_not_allowed"
    assert "gpt-secret" in error["message"] and "fake-chat, fake-big" in error["message"]
    row = ChatSession.objects.get(pk=session.pk)
    assert (row.model, row.title) == ("", "Kept")
    empty = api.patch(f"/api/v1/chat/sessions/{session.pk}", {}, format="json")
    assert empty.status_code == 400


def test_someone_elses_chat_is_a_404(outsider_api, owner):
    session = ChatSessionFactory(owner=owner)
    r = outsider_api.patch(
        f"/api/v1/chat/sessions/{session.pk}", {"model": "fake-big"}, format="json"
    )
    assert r.status_code == 404
    assert ChatSession.objects.get(pk=session.pk).model == ""


def test_the_send_uses_the_chat_model_over_the_agents(api, owner, fake_llm, settings):
    agent = AgentFactory(owner=owner, model="fake-chat")
    session = ChatSessionFactory(owner=owner, agent=agent)
    fake_llm.script("from the agent's model")
    api.post("/api/v1/chat/send", {"session_id": session.pk, "content": "one"}, format="json")
    assert fake_llm.calls[-1].body["model"] == "fake-chat"
    api.patch(f"/api/v1/chat/sessions/{session.pk}", {"model": "fake-big"}, format="json")
    fake_llm.script("from the chat's model")
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": "two"}, format="json")
    assert r.status_code == 200, r.content
    assert fake_llm.calls[-1].body["model"] == "fake-big"
    # Taken off the allow-list by the operator: the agent's model again.
    settings.LLM_ALLOWED_MODELS = ["fake-chat"]
    fake_llm.script("back to the agent's")
    api.post("/api/v1/chat/send", {"session_id": session.pk, "content": "three"}, format="json")
    assert fake_llm.calls[-1].body["model"] == "fake-chat"
