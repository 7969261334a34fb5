"""What day it is for an agent: the date its daily notes are filed under.

Stored times are UTC, but a day is local: with dates taken in UTC, a user at UTC+8 who talks
to an agent before 08:00 finds the morning's notes in yesterday's file. Notes are dated in the
agent's own `config_json["time_zone"]` when it has one (an IANA name, checked on save), else in
the operator's TIME_ZONE."""

from __future__ import annotations

import zoneinfo
from datetime import datetime, tzinfo

from django.utils import timezone

from chat.models import Agent
from chat.services.agents import agent_settings


def agent_zone(*, agent: Agent) -> tzinfo:
    name = agent_settings(agent=agent).time_zone
    return zoneinfo.ZoneInfo(name) if name else timezone.get_default_timezone()


def agent_now(*, agent: Agent) -> datetime:
    """Now, in the agent's time zone: `.date()` is the daily note it belongs in."""
    return timezone.localtime(timezone.now(), agent_zone(agent=agent))
