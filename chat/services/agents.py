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

from cadau.contextconfig import context_over_cap
from cadau.zones import zone_known
from chat.context.prompt import model_allowed
from chat.errors import InvalidConfig, InvalidInput
from chat.models import Agent
from chat.text import line_problem
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
    "time_zone": (
        str,
        "IANA time zone (Asia/Shanghai) the agent's daily notes are dated in "
        "(default: the server's TIME_ZONE)",
    ),
}
TIME_ZONE_MAX = 64
# For users who are not staff: the most an agent may set its own knobs to (the server's own
# behaviour for sessions without an agent), as each one costs model use.
_AGENT_CAPS = {
    "max_tool_rounds": DEFAULT_MAX_TOOL_ROUNDS,
    "memory_prompt_runes": DEFAULT_MEMORY_PROMPT_RUNES,
}
_INT_BOUNDS = {
    "max_tool_rounds": (0, MAX_TOOL_ROUNDS_LIMIT),
    "memory_prompt_runes": (0, MEMORY_PROMPT_RUNES_LIMIT),
}


def _invalid(message: str) -> InvalidConfig:
    return InvalidConfig(message)


def agent_config_validate(
    *, config: Any, capped: bool = False, kept: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The checked `config_json`, or InvalidConfig naming the key.
    Unknown keys and wrong types are refused rather than ignored: a typo such as
    `memory_auto_extact` must not silently leave extraction on. `capped`: values over the
    server's caps are refused, except those equal to `kept` (the stored config's): an operator
    may raise an agent's caps, and its owner must still be able to flip a switch on the page,
    which sends the whole config back."""
    kept = kept if isinstance(kept, dict) else {}
    # null too: `{"config_json": null}` wiped an agent's config as if it were {}.
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
    if "time_zone" in config and time_zone_checked(name=config["time_zone"]) is None:
        raise _invalid(
            f"config_json.time_zone: {config['time_zone']!r} is not an IANA time zone name "
            "(such as Asia/Shanghai or Europe/Berlin)"
        )
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
        server = settings.CHAT_CONTEXT
        try:
            cfg = server.with_overrides(config["context"], source="config_json.context")
        except ImproperlyConfigured as exc:
            raise _invalid(str(exc)) from None
        if capped and config["context"] != kept.get("context"):
            for key, value, cap in context_over_cap(cfg, cap=server):
                raise _invalid(
                    f"config_json.context.{key}: {value} is over this server's {cap}; "
                    "only staff may raise it"
                )
    if capped:
        for key, cap in _AGENT_CAPS.items():
            if key in config and config[key] > cap and config[key] != kept.get(key):
                raise _invalid(
                    f"config_json.{key}: {config[key]} is over this server's {cap}; "
                    "only staff may raise it"
                )
    return dict(config)


def time_zone_checked(*, name: Any) -> str | None:
    """`name` when it is an IANA time zone name the system knows, else None (cadau/zones.py:
    not a folder of the tz database, a path, or `posixrules`)."""
    if not isinstance(name, str) or len(name) > TIME_ZONE_MAX or not zone_known(name):
        return None
    return name


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """`config_json` with the defaults applied."""

    memory_auto_append: bool = False
    memory_auto_extract: bool = True
    max_tool_rounds: int = DEFAULT_MAX_TOOL_ROUNDS
    memory_prompt_runes: int = DEFAULT_MEMORY_PROMPT_RUNES
    # "" means the server's TIME_ZONE.
    time_zone: str = ""


def agent_settings(*, agent: Agent, capped: bool = False) -> AgentSettings:
    """`capped`: the owner is not staff, so the knobs that cost model use stop at the server's
    values (refused on save; this holds for agents saved before the cap, or edited by hand)."""
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
        if capped:
            values[key] = min(values[key], _AGENT_CAPS[key])
    values["time_zone"] = time_zone_checked(name=raw.get("time_zone")) or ""
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
        raise InvalidInput(f"{field} must be a string")
    if required and not value.strip():
        raise InvalidInput(f"{field} must not be empty")
    if len(value) > limit:
        raise InvalidInput(f"{field} is longer than {limit} characters")
    if field != "name":
        return value
    value = value.strip()
    problem = line_problem(value)
    if problem:
        raise InvalidInput(f"name {problem}")
    return value


# A keyword not given (None is a value the caller may pass, and is refused).
_UNSET: Any = object()


def agent_create(
    *,
    user: Any,
    name: str,
    system_prompt: str = "",
    model: str = "",
    config_json: Any = _UNSET,
) -> Agent:
    capped = not user.is_staff
    return Agent.objects.create(
        owner=user,
        name=_checked_text(name, field="name", limit=NAME_MAX, required=True),
        system_prompt=_checked_text(system_prompt, field="system_prompt", limit=SYSTEM_PROMPT_MAX),
        model=_checked_model(model, capped=capped),
        config_json=agent_config_validate(
            config={} if config_json is _UNSET else config_json, capped=capped
        ),
    )


def _checked_model(value: Any, *, capped: bool) -> str:
    model = _checked_text(value, field="model", limit=MODEL_MAX).strip()
    if capped and not model_allowed(model=model):
        allowed = ", ".join(settings.LLM_ALLOWED_MODELS) or "none"
        raise InvalidConfig(
            f"model: {model!r} is not one this server allows (allowed: {allowed}; empty for the "
            "server's default)"
        )
    return model


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
    # The owner edits their own agent: their standing decides the caps.
    capped = not agent.owner.is_staff
    if name is not _UNSET:
        agent.name = _checked_text(name, field="name", limit=NAME_MAX, required=True)
        fields.append("name")
    if system_prompt is not _UNSET:
        agent.system_prompt = _checked_text(
            system_prompt, field="system_prompt", limit=SYSTEM_PROMPT_MAX
        )
        fields.append("system_prompt")
    if model is not _UNSET:
        agent.model = _checked_model(model, capped=capped)
        fields.append("model")
    if config_json is not _UNSET:
        agent.config_json = agent_config_validate(
            config=config_json, capped=capped, kept=agent.config_json
        )
        fields.append("config_json")
    if fields:
        agent.save(update_fields=[*fields, "updated_at"])
    return agent


def agent_delete(*, agent: Agent) -> None:
    # Its sessions stay (agent set to NULL, they become plain chats) and so do its memory files
    # under RUNTIME_DIR: deleting an agent must not silently destroy what it remembered. Agent
    # ids are never reused (AUTOINCREMENT / sequences), so a new agent never inherits them.
    agent.delete()
