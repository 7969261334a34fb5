"""/api/v1/agents: CRUD, config_json validation (unknown keys, wrong types, bad context knobs,
unknown tools) in the contract's error shape, and ownership (another user's agent is a 404)."""

from __future__ import annotations

import pytest

from chat.models import Agent, ChatSession
from chat.services.agents import agent_settings
from tests.factories import AgentFactory, ChatSessionFactory

pytestmark = pytest.mark.django_db


def test_create_list_retrieve_update_delete(api, owner, settings):
    settings.LLM_ALLOWED_MODELS = ["gpt-x"]  # the operator allows the model the agent names
    r = api.post(
        "/api/v1/agents",
        {
            "name": "  Researcher ",
            "system_prompt": "You dig.",
            "model": "gpt-x",
            "config_json": {
                "memory_auto_append": True,
                "tools": ["memory_search", "current_time"],
                "max_tool_rounds": 3,
                "context": {"input_budget_runes": 20000, "threshold_pct": 80},
                "memory_prompt_runes": 500,
            },
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert set(body) == {
        "id",
        "name",
        "system_prompt",
        "model",
        "config_json",
        "created_at",
        "updated_at",
    }
    assert body["name"] == "Researcher"
    agent_id = body["id"]
    assert Agent.objects.get(pk=agent_id).owner == owner

    listed = api.get("/api/v1/agents").json()["results"]
    assert [a["id"] for a in listed] == [agent_id]
    assert api.get(f"/api/v1/agents/{agent_id}").json()["model"] == "gpt-x"

    r = api.patch(
        f"/api/v1/agents/{agent_id}", {"config_json": {"memory_auto_extract": False}}, format="json"
    )
    assert r.status_code == 200, r.content
    assert r.json()["config_json"] == {"memory_auto_extract": False}  # replaced, not merged
    assert r.json()["name"] == "Researcher"  # untouched
    settings = agent_settings(agent=Agent.objects.get(pk=agent_id))
    assert (settings.memory_auto_extract, settings.memory_auto_append) == (False, False)

    session = ChatSessionFactory(owner=owner, agent_id=agent_id)
    assert api.delete(f"/api/v1/agents/{agent_id}").status_code == 204
    assert not Agent.objects.filter(pk=agent_id).exists()
    session.refresh_from_db()
    assert session.agent_id is None  # the chat stays, as a plain one


def test_defaults_when_config_is_empty(api):
    r = api.post("/api/v1/agents", {"name": "Plain"}, format="json")
    assert r.status_code == 201
    assert r.json()["config_json"] == {}
    settings = agent_settings(agent=Agent.objects.get(pk=r.json()["id"]))
    assert settings.memory_auto_extract is True
    assert settings.memory_auto_append is False
    assert settings.max_tool_rounds == 8


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"memory_auto_extact": True}, "unknown key"),
        ({"memory_auto_append": "yes"}, "memory_auto_append must be a bool"),
        ({"memory_auto_extract": 1}, "memory_auto_extract must be a bool"),
        ({"max_tool_rounds": "3"}, "max_tool_rounds must be a int"),
        ({"max_tool_rounds": True}, "max_tool_rounds must be a int"),
        ({"max_tool_rounds": 1000}, "between"),
        ({"memory_prompt_runes": -1}, "between"),
        ({"tools": "memory_search"}, "tools must be a list"),
        ({"tools": ["rm_rf"]}, "unknown tool 'rm_rf'"),
        ({"tools": [1]}, "list of tool names"),
        ({"tools": ["current_time", "current_time"]}, "twice"),
        ({"context": {"threshold_pct": 500}}, "threshold_pct"),
        ({"context": {"budget": 1}}, "unknown key"),
        ({"context": {"target_pct": 95}}, "target_pct"),
        ({"context": []}, "context must be a dict"),
        ([], "must be a JSON object"),
        ("x", "must be a JSON object"),
    ],
)
def test_config_json_is_validated(api, config, needle):
    r = api.post("/api/v1/agents", {"name": "A", "config_json": config}, format="json")
    assert r.status_code == 400, r.content
    error = r.json()["error"]
    assert error["code"] == "invalid_config"
    assert needle in error["message"]
    assert not Agent.objects.exists()


def test_patch_validates_config_and_leaves_the_row_alone(api, owner):
    agent = AgentFactory(owner=owner, config_json={"max_tool_rounds": 2})
    r = api.patch(f"/api/v1/agents/{agent.pk}", {"config_json": {"nope": 1}}, format="json")
    assert r.status_code == 400
    agent.refresh_from_db()
    assert agent.config_json == {"max_tool_rounds": 2}


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"name": ""},
        {"name": "   "},
        {"name": 5},
        {"name": "x" * 101},
        {"name": "ok", "model": ["gpt"]},
        {"name": "ok", "owner": 3},
    ],
)
def test_bad_fields_are_400(api, payload):
    r = api.post("/api/v1/agents", payload, format="json")
    assert r.status_code == 400, r.content
    assert set(r.json()["error"]) >= {"code", "message"}


def test_body_must_be_an_object(api):
    r = api.post("/api/v1/agents", [1, 2], format="json")
    assert r.status_code == 400


def test_outsider_gets_404_everywhere(api, owner, outsider_api):
    agent = AgentFactory(owner=owner)
    base = f"/api/v1/agents/{agent.pk}"
    assert outsider_api.get(base).status_code == 404
    assert outsider_api.patch(base, {"name": "mine"}, format="json").status_code == 404
    assert outsider_api.delete(base).status_code == 404
    for path in (f"{base}/memory/daily", f"{base}/memory/entries", f"{base}/memory/entries/x"):
        r = outsider_api.get(path)
        assert r.status_code == 404
        assert r.json() == {"error": {"code": "not_found", "message": "Not found."}}
    assert (
        outsider_api.post(f"{base}/memory/entries", {"content": "x"}, format="json").status_code
        == 404
    )
    assert outsider_api.delete(f"{base}/memory/entries/x").status_code == 404
    assert outsider_api.get("/api/v1/agents").json()["results"] == []
    agent.refresh_from_db()
    assert agent.name != "mine"


@pytest.mark.parametrize("bad_id", ["abc", "0", "-1", "99999999999999999999"])
def test_malformed_ids_are_json_404(api, bad_id):
    r = api.get(f"/api/v1/agents/{bad_id}")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


def test_anonymous_is_refused(anon_api):
    assert anon_api.get("/api/v1/agents").status_code in (401, 403)


def test_session_with_someone_elses_agent_is_404(api, outsider):
    agent = AgentFactory(owner=outsider)
    r = api.post("/api/v1/chat/sessions", {"agent_id": agent.pk}, format="json")
    assert r.status_code == 404
    assert not ChatSession.objects.exists()
