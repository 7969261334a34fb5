"""What a user who is not staff may spend of the operator's model (issue 14, item 1): the
models the operator allows, every per-agent knob capped at the server's own value (a 400 naming
the key and the cap; clamped again when a stored value is over), and a maximum message size."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from cadau.contextconfig import ContextConfig
from chat.models import Agent, ChatMessage
from tests.chat.wsclient import loop_left_clean as _loop_left_clean
from tests.factories import AgentFactory, ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db(transaction=True)
# Sockets' replies finish, and each test gets its own channel layer (Redis keeps loop state).
loop_left_clean = _loop_left_clean

SERVER = ContextConfig(
    input_budget_runes=6000,
    history_read_limit=500,
    max_rounds=3,
    summary_max_runes=800,
    roll_batch=8,
)


@pytest.fixture
def server_caps(settings):
    settings.CHAT_CONTEXT = SERVER
    settings.LLM_ALLOWED_MODELS = ["fake-chat"]
    return SERVER


@pytest.fixture
def staff_api(db) -> APIClient:
    staff = get_user_model().objects.create_user(username="ops", password="pw-1", is_staff=True)
    client = APIClient()
    client.force_authenticate(staff)
    return client


def _error(response) -> str:
    assert response.status_code == 400, response.content
    return str(response.json()["error"]["message"])


def test_a_model_the_operator_does_not_allow_is_refused(api, server_caps):
    message = _error(api.post("/api/v1/agents", {"name": "a", "model": "gpt-4-32k"}, format="json"))
    assert "gpt-4-32k" in message and "fake-chat" in message
    assert Agent.objects.count() == 0
    allowed = api.post("/api/v1/agents", {"name": "a", "model": "fake-chat"}, format="json")
    assert allowed.status_code == 201
    default = api.post("/api/v1/agents", {"name": "b", "model": ""}, format="json")
    assert default.status_code == 201  # empty: the server's own model


@pytest.mark.parametrize(
    ("key", "value", "cap"),
    [
        ("input_budget_runes", 10_000_000, 6000),
        ("history_read_limit", 1_000_000, 500),
        ("max_rounds", 1000, 3),
        ("summary_max_runes", 1_000_000, 800),
        ("roll_batch", 500, 8),
    ],
)
def test_each_context_knob_over_the_server_is_a_400_naming_it(api, server_caps, key, value, cap):
    body = {"name": "a", "config_json": {"context": {key: value}}}
    message = _error(api.post("/api/v1/agents", body, format="json"))
    assert key in message and str(cap) in message
    assert Agent.objects.count() == 0


@pytest.mark.parametrize(
    ("key", "value"), [("max_tool_rounds", 50), ("memory_prompt_runes", 10**6)]
)
def test_agent_knobs_over_the_server_are_a_400(api, owner, server_caps, key, value):
    agent = AgentFactory(owner=owner, config_json={})
    message = _error(
        api.patch(f"/api/v1/agents/{agent.pk}", {"config_json": {key: value}}, format="json")
    )
    assert key in message
    agent.refresh_from_db()
    assert agent.config_json == {}


def test_staff_may_raise_knobs_and_name_any_model(staff_api, server_caps):
    body = {
        "name": "big",
        "model": "gpt-4-32k",
        "config_json": {"max_tool_rounds": 20, "context": {"input_budget_runes": 100_000}},
    }
    response = staff_api.post("/api/v1/agents", body, format="json")
    assert response.status_code == 201, response.content


def test_a_stored_value_over_the_cap_is_clamped_when_the_model_is_called(
    api, owner, server_caps, fake_llm
):
    """A value written before the cap existed (or straight into the database) never reaches
    the model: the payload is built within the server's budget."""
    agent = AgentFactory(owner=owner)
    Agent.objects.filter(pk=agent.pk).update(
        config_json={"context": {"input_budget_runes": 10_000_000, "history_read_limit": 10**6}}
    )
    session = ChatSessionFactory(owner=owner, agent=agent)
    make_conversation(session, turns=40, words=60)  # ~40,000 characters of history
    response = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "and now?"}, format="json"
    )
    assert response.status_code == 200, response.content
    sent = sum(len(m.get("content") or "") for m in fake_llm.calls[-1].body["messages"])
    assert sent <= SERVER.effective_hard_limit_runes
    assert response.json()["context_budget"]["limit_runes"] <= SERVER.input_budget_runes


def test_a_message_over_the_limit_is_refused_over_rest(api, owner, settings, fake_llm):
    settings.CHAT_MAX_MESSAGE_RUNES = 1000
    session = ChatSessionFactory(owner=owner)
    response = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "x" * 1001}, format="json"
    )
    assert response.status_code in (400, 413)
    assert response.json()["error"]["code"] == "message_too_large"
    assert "1000" in response.json()["error"]["message"]
    assert ChatMessage.objects.count() == 0 and fake_llm.count() == 0
    ok = api.post(
        "/api/v1/chat/send", {"session_id": session.pk, "content": "x" * 1000}, format="json"
    )
    assert ok.status_code == 200


async def test_a_message_over_the_limit_is_refused_over_the_websocket(owner, settings, fake_llm):
    from channels.db import database_sync_to_async

    from tests.test_bad_input import _ws

    settings.CHAT_MAX_MESSAGE_RUNES = 1000
    session = await database_sync_to_async(ChatSessionFactory)(owner=owner)
    ws = await _ws(session.pk, owner)
    assert (await ws.connect(timeout=5))[0]
    await ws.send_json_to({"type": "send", "content": "汉" * 1001})
    event = await ws.receive_json_from(timeout=5)
    assert event["type"] == "error" and event["code"] == "message_too_large"
    await ws.disconnect()
    assert await database_sync_to_async(ChatMessage.objects.count)() == 0
    assert fake_llm.count() == 0


def test_an_owner_may_keep_what_an_operator_raised_and_change_the_rest(api, owner, server_caps):
    # The agents page sends the whole config back when a switch flips: the raised values
    # refused every change (a probe). Kept as stored, they pass; raised further, or set anew
    # over the cap, they are still refused.
    raised = {"max_tool_rounds": 50, "context": {"input_budget_runes": 200_000}}
    agent = AgentFactory(owner=owner)
    Agent.objects.filter(pk=agent.pk).update(config_json=raised)
    url = f"/api/v1/agents/{agent.pk}"
    switched = {**raised, "memory_auto_append": True}
    response = api.patch(url, {"config_json": switched}, format="json")
    assert response.status_code == 200, response.content
    agent.refresh_from_db()
    assert agent.config_json == switched
    for higher in (
        {**switched, "max_tool_rounds": 40},  # lower than raised, still over the cap: new
        {**switched, "context": {"input_budget_runes": 300_000}},
    ):
        assert "only staff" in _error(api.patch(url, {"config_json": higher}, format="json"))
    agent.refresh_from_db()
    assert agent.config_json == switched
