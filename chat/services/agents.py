"""Writes on agents, and the one definition of `Agent.config_json`.

Callers pass objects they already got through `agent_for_user`, so ownership is settled before
anything here runs. Every write validates `config_json` with `agent_config_validate`; readers
use `agent_settings`, which applies the defaults and tolerates a row edited by hand (a bad value
falls back to its default instead of breaking sends)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from chat.api.errors import ApiError
from chat.models import Agent
from chat.tools import tools_enabled_for, tools_registered

NAME_MAX = 100
MODEL_MAX = 200
SYSTEM_PROMPT_MAX = 50_000

DEFAULT_MAX_TOOL_ROUNDS = 8
MAX_TOOL_ROUNDS_LIMIT = 50
DEFAULT_MEMORY_PROMPT_RUNES = 2_000
MEMORY_PROMPT_RUNES_LIMIT = 50_000

# key -> (type, description). `bool` is checked with `type() is`, so 0/1 are not booleans and
# True is not an int.
CONFIG_KEYS: dict[str, tuple[type, str]] = {
    "memory_auto_append": (bool, "append every finished turn to the daily note (default false)"),
    "memory_auto_extract": (bool, "distil facts from batches before compaction (default true)"),
    "tools": (list, "enabled tool names (default: every built-in tool)"),
    "max_tool_rounds": (int, f"tool-call rounds per message (default {DEFAULT_MAX_TOOL_ROUNDS})"),
    "context": (dict, "CHAT_CONTEXT knobs overriding the global ones for this agent"),
    "memory_prompt_runes": (
        int,
        f"rune cap of long-term memory in the system prompt "
        f"(default {DEFAULT_MEMORY_PROMPT_RUNES})",
    ),
}
_INT_BOUNDS = {
    "max_tool_rounds": (0, MAX_TOOL_ROUNDS_LIMIT),
    "memory_prompt_runes": (0, MEMORY_PROMPT_RUNES_LIMIT),
}


def _invalid(message: str) -> ApiError:
    return ApiError(message, code="invalid_config")


def agent_config_validate(*, config: Any) -> dict[str, Any]:
    """The checked `config_json`, or ApiError (400, code `invalid_config`) naming the key.
    Unknown keys and wrong types are refused rather than ignored: a typo such as
    `memory_auto_extact` must not silently leave extraction on."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise _invalid("config_json must be a JSON object")
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise _invalid(
            f"config_json: unknown key(s) {', '.join(unknown)}; known: {', '.join(CONFIG_KEYS)}"
        )
    for key, value in config.items():
        expected, _ = CONFIG_KEYS[key]
        if type(value) is not expected:
            raise _invalid(f"config_json.{key} must be a {expected.__name__}, got {value!r}")
        if key in _INT_BOUNDS and isinstance(value, int):
            low, high = _INT_BOUNDS[key]
            if not low <= value <= high:
                raise _invalid(f"config_json.{key} must be between {low} and {high}")
    if "tools" in config:
        names = config["tools"]
        registry = tools_registered()
        for name in names:
            if not isinstance(name, str):
                raise _invalid("config_json.tools must be a list of tool names")
            if name not in registry:
                raise _invalid(
                    f"config_json.tools: unknown tool {name!r}; available: "
                    f"{', '.join(sorted(registry))}"
                )
        if len(set(names)) != len(names):
            raise _invalid("config_json.tools lists a tool twice")
    if "context" in config:
        try:
            settings.CHAT_CONTEXT.with_overrides(config["context"], source="config_json.context")
        except ImproperlyConfigured as exc:
            raise _invalid(str(exc)) from None
    return dict(config)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """`config_json` with the defaults applied."""

    memory_auto_append: bool = False
    memory_auto_extract: bool = True
    max_tool_rounds: int = DEFAULT_MAX_TOOL_ROUNDS
    memory_prompt_runes: int = DEFAULT_MEMORY_PROMPT_RUNES


def agent_settings(*, agent: Agent) -> AgentSettings:
    raw = agent.config_json if isinstance(agent.config_json, dict) else {}
    defaults = AgentSettings()
    values: dict[str, Any] = {}
    for key in ("memory_auto_append", "memory_auto_extract"):
        value = raw.get(key)
        values[key] = value if type(value) is bool else getattr(defaults, key)
    for key in ("max_tool_rounds", "memory_prompt_runes"):
        value = raw.get(key)
        low, high = _INT_BOUNDS[key]
        ok = type(value) is int and low <= value <= high
        values[key] = value if ok else getattr(defaults, key)
    return AgentSettings(**values)


def agent_tools(*, agent: Agent | None) -> list[Any]:
    """The tools this agent's model is offered; none for a session without an agent."""
    if agent is None:
        return []
    return tools_enabled_for(
        config=agent.config_json if isinstance(agent.config_json, dict) else {}
    )


def _checked_text(value: Any, *, field: str, limit: int, required: bool = False) -> str:
    if not isinstance(value, str):
        raise ApiError(f"{field} must be a string", code="invalid")
    if required and not value.strip():
        raise ApiError(f"{field} must not be empty", code="invalid")
    if len(value) > limit:
        raise ApiError(f"{field} is longer than {limit} characters", code="invalid")
    return value.strip() if field == "name" else value


def agent_create(
    *,
    user: Any,
    name: str,
    system_prompt: str = "",
    model: str = "",
    config_json: Any = None,
) -> Agent:
    return Agent.objects.create(
        owner=user,
        name=_checked_text(name, field="name", limit=NAME_MAX, required=True),
        system_prompt=_checked_text(system_prompt, field="system_prompt", limit=SYSTEM_PROMPT_MAX),
        model=_checked_text(model, field="model", limit=MODEL_MAX).strip(),
        config_json=agent_config_validate(config=config_json),
    )


_UNSET: Any = object()


def agent_update(
    *,
    agent: Agent,
    name: Any = _UNSET,
    system_prompt: Any = _UNSET,
    model: Any = _UNSET,
    config_json: Any = _UNSET,
) -> Agent:
    """Change the given fields only. `config_json` is replaced as a whole (not merged), so a
    client can remove a key; it is validated like on create."""
    fields = []
    if name is not _UNSET:
        agent.name = _checked_text(name, field="name", limit=NAME_MAX, required=True)
        fields.append("name")
    if system_prompt is not _UNSET:
        agent.system_prompt = _checked_text(
            system_prompt, field="system_prompt", limit=SYSTEM_PROMPT_MAX
        )
        fields.append("system_prompt")
    if model is not _UNSET:
        agent.model = _checked_text(model, field="model", limit=MODEL_MAX).strip()
        fields.append("model")
    if config_json is not _UNSET:
        agent.config_json = agent_config_validate(config=config_json)
        fields.append("config_json")
    if fields:
        agent.save(update_fields=[*fields, "updated_at"])
    return agent


def agent_delete(*, agent: Agent) -> None:
    # Its sessions stay (agent set to NULL, they become plain chats) and so do its memory files
    # under RUNTIME_DIR: deleting an agent must not silently destroy what it remembered. Agent
    # ids are never reused (AUTOINCREMENT / sequences), so a new agent never inherits them.
    agent.delete()
