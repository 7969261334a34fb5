"""The tool registry of the agent tool loop: one place that knows every tool a model may
call, whoever defined it.

A tool is a name, a description, a JSON-schema for its arguments and a sync handler
`handler(context, arguments) -> str`. Handlers run in a worker thread (they may touch the
database or the memory store); whatever they raise becomes the tool's result text, so a broken
tool never ends the loop. Raise `ToolError` for a message meant for the model.

Built-ins (`builtin=True`): `current_time` here, and the memory and workspace tools that
`agentmemory` registers from its AppConfig.ready(). A deployment adds its own by listing dotted
paths to `Tool` objects in `settings.AGENT_TOOLS`, or by calling `tool_register()` from its own
AppConfig.ready().

Which tools an agent gets (`tools_enabled_for`): its `config_json["tools"]` list when present
(any registered names, so a deployment tool must be enabled explicitly), otherwise every
built-in. Sessions without an agent get no tools.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.utils.module_loading import import_string

from cadau.zones import zone_known
from chat.models import Agent

logger = logging.getLogger("chat.tools")

# OpenAI's rule for function names.
TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ToolError(Exception):
    """A failure whose message is meant for the model (bad argument, missing file...)."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Who is calling: tools act for this agent, in this session, answering this message."""

    agent_id: int
    session_id: int
    user_id: int
    user_message_id: int | None = None


ToolHandler = Callable[[ToolContext, dict[str, Any]], str]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    handler: ToolHandler
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}, "additionalProperties": False}
    )
    builtin: bool = False

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


_registry: dict[str, Tool] = {}
_lock = threading.Lock()
_settings_loaded: tuple[str, ...] = ()


def tool_register(tool: Tool, *, replace: bool = False) -> Tool:
    """Add `tool`. Re-registering the very same object is a no-op (ready() may run twice);
    another tool under a taken name needs `replace=True`."""
    _tools_register([tool], replace=replace)
    return tool


def _tools_register(tools: list[Tool], *, replace: bool = False) -> None:
    """Add every one of `tools`, or (ValueError, TypeError) none of them."""
    with _lock:
        named: dict[str, Tool] = {}
        for tool in tools:
            if not TOOL_NAME_RE.fullmatch(tool.name):
                raise ValueError(f"tool name {tool.name!r} must match {TOOL_NAME_RE.pattern}")
            if not callable(tool.handler):
                raise TypeError(f"tool {tool.name!r}: handler is not callable")
            existing = named.get(tool.name) or _registry.get(tool.name)
            if existing is not None and existing is not tool and not replace:
                raise ValueError(f"a tool named {tool.name!r} is already registered")
            named[tool.name] = tool
        _registry.update(named)


def _load_settings_tools() -> None:
    # Lazily (a deployment module listed in AGENT_TOOLS may itself import chat models), and
    # again whenever the setting changes (tests override it).
    global _settings_loaded
    paths = tuple(getattr(settings, "AGENT_TOOLS", ()) or ())
    if paths == _settings_loaded:
        return
    # Every path resolved and checked before any is registered: a bad one registers none, and
    # the next call (the start-up check, then every send's) names it again.
    _tools_register([_settings_tool(path) for path in paths])
    _settings_loaded = paths


def _settings_tool(path: str) -> Tool:
    target = import_string(path)
    tool = target if isinstance(target, Tool) else target() if callable(target) else None
    if not isinstance(tool, Tool):
        raise TypeError(f"{path} is neither a chat.tools.Tool nor a callable returning one")
    return tool


def tools_registered() -> dict[str, Tool]:
    _load_settings_tools()
    with _lock:
        return dict(_registry)


def builtin_tool_names() -> list[str]:
    return sorted(name for name, tool in tools_registered().items() if tool.builtin)


def tools_enabled_for(*, config: dict[str, Any] | None) -> list[Tool]:
    """The tools an agent with this `config_json` may call, in a stable order. Names that are
    no longer registered (a deployment removed a tool) are skipped, not an error."""
    registry = tools_registered()
    wanted: Iterable[str]
    raw = (config or {}).get("tools")
    if isinstance(raw, list):
        wanted = [name for name in raw if isinstance(name, str)]
    else:
        wanted = builtin_tool_names()
    seen: set[str] = set()
    enabled = []
    for name in wanted:
        tool = registry.get(name)
        if tool is not None and name not in seen:
            seen.add(name)
            enabled.append(tool)
    return enabled


def _call_parts(tool_call: dict[str, Any]) -> tuple[str, str]:
    function = tool_call.get("function") if isinstance(tool_call, dict) else None
    if not isinstance(function, dict):
        return "", ""
    name = function.get("name")
    arguments = function.get("arguments")
    return (name if isinstance(name, str) else ""), (
        arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    )


def tool_run(
    *, tool_call: dict[str, Any], context: ToolContext, enabled: dict[str, Tool]
) -> tuple[str, bool]:
    """Run one OpenAI-format tool call. Returns (result text, is_error). Never raises: a model
    calling a tool it was not given, malformed arguments or a crashing handler all become an
    error text the model can read and react to."""
    name, raw_arguments = _call_parts(tool_call)
    tool = enabled.get(name)
    if tool is None:
        return f"Error: there is no tool named {name!r} available here.", True
    try:
        arguments = json.loads(raw_arguments) if raw_arguments.strip() else {}
    except ValueError as exc:
        return f"Error: the arguments are not valid JSON ({exc}).", True
    if not isinstance(arguments, dict):
        return "Error: the arguments must be a JSON object.", True
    try:
        result = tool.handler(context, arguments)
    except ToolError as exc:
        return f"Error: {exc}", True
    except Exception as exc:  # a tool bug must not end the turn; the model sees what broke
        logger.exception("chat_tool_failed tool=%s session=%s", name, context.session_id)
        return f"Error: {type(exc).__name__}: {exc}", True
    return (result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)), False


# --- helpers for handlers ------------------------------------------------------------------


def arg_str(
    arguments: dict[str, Any], key: str, *, required: bool = True, default: str = ""
) -> str:
    value = arguments.get(key)
    if value is None:
        if required:
            raise ToolError(f"missing argument {key!r}")
        return default
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} must be a string")
    return value


# --- built-in: current_time ----------------------------------------------------------------


def _agent_time_zone(agent_id: int) -> str:
    """The agent's config_json time_zone ("" when none, or not a known zone: a hand-edited
    row), so the model's "today" is the day its daily notes are filed under."""
    config = Agent.objects.filter(pk=agent_id).values_list("config_json", flat=True).first()
    name = config.get("time_zone") if isinstance(config, dict) else None
    return str(name) if zone_known(name) else ""


def _current_time(context: ToolContext, arguments: dict[str, Any]) -> str:
    zone_name = (
        arg_str(arguments, "timezone", required=False, default="")
        or _agent_time_zone(context.agent_id)
        or settings.TIME_ZONE
    )
    if not zone_known(zone_name):
        raise ToolError(
            f"unknown time zone {zone_name[:100]!r} (use an IANA name like Europe/Paris)"
        )
    zone = ZoneInfo(zone_name)
    now = datetime.now(UTC)
    local = now.astimezone(zone)
    return json.dumps(
        {
            "utc": now.isoformat(timespec="seconds"),
            "local": local.isoformat(timespec="seconds"),
            "timezone": zone_name,
            "weekday": local.strftime("%A"),
        }
    )


CURRENT_TIME = tool_register(
    Tool(
        name="current_time",
        description=(
            "The current date and time (UTC and in a time zone, default the agent's or the "
            "server's)."
        ),
        parameters={
            "type": "object",
            "properties": {
                "timezone": {"type": "string", "description": "IANA zone, e.g. Asia/Shanghai"}
            },
            "additionalProperties": False,
        },
        handler=_current_time,
        builtin=True,
    )
)
