"""Daily notes are dated in the agent's time zone, else the operator's TIME_ZONE, not in UTC
(agentmemory/clock.py): with a fixed clock at 23:30 UTC, it is already tomorrow at UTC+8."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import pytest
from django.utils import timezone

from agentmemory import store
from agentmemory.clock import agent_now
from agentmemory.flush import ARCHIVE_HEADING
from agentmemory.hooks import memory_auto_append
from agentmemory.models import MemoryFlush
from chat.context import context_compact
from chat.errors import InvalidConfig
from chat.models import Agent, ChatMessage, MessageRole, MessageStatus
from chat.services.agents import agent_config_validate, agent_settings
from tests.factories import AgentFactory, ChatSessionFactory, make_conversation

pytestmark = pytest.mark.django_db

# 23:30 on 1 March in UTC is 07:30 on 2 March in Shanghai and 15:30 on 1 March in Los Angeles.
FIXED = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)
UTC_DAY, SHANGHAI_DAY = date(2026, 3, 1), date(2026, 3, 2)


@pytest.fixture
def fixed_clock(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: FIXED)
    return FIXED


@pytest.mark.parametrize(
    ("agent_zone", "server_zone", "day", "hour"),
    [
        (None, "UTC", UTC_DAY, 23),
        (None, "Asia/Shanghai", SHANGHAI_DAY, 7),  # the operator's zone
        ("Asia/Shanghai", "UTC", SHANGHAI_DAY, 7),  # the agent's zone wins
        ("America/Los_Angeles", "Asia/Shanghai", UTC_DAY, 15),
        ("Pacific/Kiritimati", "UTC", SHANGHAI_DAY, 13),  # UTC+14
    ],
)
def test_the_agent_day(owner, fixed_clock, settings, agent_zone, server_zone, day, hour):
    settings.TIME_ZONE = server_zone
    config = {"time_zone": agent_zone} if agent_zone else {}
    agent = AgentFactory(owner=owner, config_json=config)
    now = agent_now(agent=agent)
    assert (now.date(), now.hour) == (day, hour)
    assert now == FIXED  # the same instant, only read in another zone


def test_a_turn_before_eight_at_utc_plus_8_lands_in_that_day(runtime, owner, fixed_clock, settings):
    settings.TIME_ZONE = "UTC"
    agent = AgentFactory(
        owner=owner, config_json={"memory_auto_append": True, "time_zone": "Asia/Shanghai"}
    )
    session = ChatSessionFactory(owner=owner, agent=agent)
    user = ChatMessage.objects.create(session=session, role=MessageRole.USER, content="早上好")
    reply = ChatMessage.objects.create(
        session=session,
        role=MessageRole.ASSISTANT,
        content="早上好！",
        status=MessageStatus.COMPLETE,
    )
    memory_auto_append(session=session, user_message=user, assistant_message=reply)
    assert store.daily_note_list(agent_id=agent.pk) == [SHANGHAI_DAY]
    note = store.daily_note_read(agent_id=agent.pk, day=SHANGHAI_DAY)
    assert note.startswith(f"# {SHANGHAI_DAY.isoformat()}")
    assert "Turn · 07:30 CST" in note and "早上好！" in note


def test_the_compaction_archive_is_dated_in_the_agent_zone(
    runtime, owner, fake_llm, fixed_clock, settings
):
    settings.TIME_ZONE = "UTC"
    agent = AgentFactory(
        owner=owner,
        config_json={
            "context": {"input_budget_runes": 2000, "target_pct": 40, "summary_max_runes": 300},
            "time_zone": "Asia/Shanghai",
        },
    )
    session = ChatSessionFactory(owner=owner, agent=agent)
    make_conversation(session, turns=12, words=12)
    fake_llm.script("[]")
    assert context_compact(session_id=session.pk, trigger="manual").outcome == "committed"
    row = MemoryFlush.objects.get(session=session)
    assert row.note_date == SHANGHAI_DAY
    note = store.daily_note_read(agent_id=agent.pk, day=SHANGHAI_DAY)
    assert f"## {ARCHIVE_HEADING} · 07:30 CST" in note
    assert store.daily_note_read(agent_id=agent.pk, day=UTC_DAY) == ""


def test_the_daily_api_defaults_to_the_agent_today(api, owner, runtime, fixed_clock, settings):
    settings.TIME_ZONE = "UTC"
    agent = AgentFactory(owner=owner, config_json={"time_zone": "Asia/Shanghai"})
    store.daily_note_append(agent_id=agent.pk, day=SHANGHAI_DAY, heading="Note", body="hi")
    body = api.get(f"/api/v1/agents/{agent.pk}/memory/daily").json()
    assert body["date"] == SHANGHAI_DAY.isoformat() and "hi" in body["markdown"]


@pytest.mark.parametrize("name", ["Asia/Shanghai", "UTC", "Europe/Berlin", "America/New_York"])
def test_iana_names_are_accepted(name):
    assert agent_config_validate(config={"time_zone": name}) == {"time_zone": name}


@pytest.mark.parametrize(
    "value",
    [
        *[
            "UTC+8",
            "Mars/Olympus",
            "",
            " ",
            "/etc/localtime",
            "../../etc/passwd",
            "x" * 65,
            8,
            None,
        ],
        # Folders of the tz database (were a 500: IsADirectoryError), and files that are no zone.
        *["Europe", "Asia", "America", "Etc", "posixrules", "right/UTC"],
    ],
)
def test_bad_time_zones_are_refused(value):
    with pytest.raises(InvalidConfig, match="time_zone"):
        agent_config_validate(config={"time_zone": value})


def test_the_agents_api_refuses_a_bad_time_zone(api):
    r = api.post(
        "/api/v1/agents", {"name": "A", "config_json": {"time_zone": "UTC+8"}}, format="json"
    )
    assert r.status_code == 400
    assert "time_zone" in r.json()["error"]["message"]
    assert not Agent.objects.exists()


def test_a_hand_edited_bad_zone_falls_back_to_the_server(owner, fixed_clock, settings):
    settings.TIME_ZONE = "Asia/Shanghai"
    agent = AgentFactory(owner=owner, config_json={"time_zone": "Nowhere/Special"})
    assert agent_settings(agent=agent).time_zone == ""
    assert agent_now(agent=agent).date() == SHANGHAI_DAY


def test_the_current_time_tool_defaults_to_the_agent_zone(owner, settings):
    from chat.tools import CURRENT_TIME, ToolContext

    settings.TIME_ZONE = "UTC"
    agent = AgentFactory(owner=owner, config_json={"time_zone": "Asia/Shanghai"})
    context = ToolContext(agent_id=agent.pk, session_id=0, user_id=owner.pk)
    assert json.loads(CURRENT_TIME.handler(context, {}))["timezone"] == "Asia/Shanghai"
    # The model may still ask for another zone.
    asked = json.loads(CURRENT_TIME.handler(context, {"timezone": "Europe/Berlin"}))
    assert asked["timezone"] == "Europe/Berlin"
    plain = AgentFactory(owner=owner)
    context = ToolContext(agent_id=plain.pk, session_id=0, user_id=owner.pk)
    assert json.loads(CURRENT_TIME.handler(context, {}))["timezone"] == "UTC"


@pytest.mark.parametrize("zone", ["Europe", "a" * 5000, "right/UTC"])
def test_the_current_time_tool_refuses_a_folder_or_a_long_name_as_unknown(owner, zone):
    # Was IsADirectoryError / OSError, with the server's path in the tool's result.
    from chat.tools import CURRENT_TIME, ToolContext, ToolError

    context = ToolContext(agent_id=AgentFactory(owner=owner).pk, session_id=0, user_id=owner.pk)
    with pytest.raises(ToolError, match="unknown time zone") as caught:
        CURRENT_TIME.handler(context, {"timezone": zone})
    assert "site-packages" not in str(caught.value) and len(str(caught.value)) < 200
