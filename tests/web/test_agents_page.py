"""The agents page's server side (/agents/, /agents/<id>/): login, ownership, the config the
script reads. Its behaviour in a browser: tests/browser/test_agents_page.py."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from chat.middleware import CONTENT_SECURITY_POLICY
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def _config(response) -> dict:
    match = re.search(
        rb'<script id="cadau-config" type="application/json">(.*?)</script>', response.content, re.S
    )
    assert match, response.content[:500]
    return json.loads(match.group(1))


def test_the_agents_page_needs_a_login(client: Client, owner) -> None:
    agent = AgentFactory.create(owner=owner)
    for path in ("/agents/", f"/agents/{agent.pk}/"):
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_list_and_an_agent_open(web: Client, owner, settings) -> None:
    settings.LLM_ALLOWED_MODELS = ["small", "large"]
    settings.LLM_MODEL = "small"
    agent = AgentFactory.create(owner=owner, name="Researcher <b>")
    listing = web.get("/agents/")
    assert listing.status_code == 200
    assert CONTENT_SECURITY_POLICY in listing["Content-Security-Policy"]
    config = _config(listing)
    assert config["agent_id"] is None
    assert config["models"] == ["small", "large"] and config["default_model"] == "small"
    assert {"current_time"} <= {tool["name"] for tool in config["tools"]}
    assert config["strings"]["new_agent"] == "New agent"

    page = web.get(f"/agents/{agent.pk}/")
    assert page.status_code == 200 and _config(page)["agent_id"] == agent.pk
    # The name is escaped in the title, never markup.
    assert b"<title>Researcher &lt;b&gt; \xc2\xb7 My agents" in page.content
    # The chat page links here.
    assert b'id="agents-link" href="/agents/"' in web.get("/").content


def test_another_users_agent_is_a_404(web: Client, outsider) -> None:
    theirs = AgentFactory.create(owner=outsider)
    assert web.get(f"/agents/{theirs.pk}/").status_code == 404
    assert web.get("/agents/999999/").status_code == 404
    assert web.get("/agents/abc/").status_code == 404
    assert web.post("/agents/").status_code == 405


def test_the_page_is_translated(web: Client) -> None:
    response = web.get("/agents/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert "我的智能体".encode() in response.content
    assert _config(response)["strings"]["new_agent"] == "新建智能体"
