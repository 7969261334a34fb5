"""Built-in agent tools over the memory store: memory_write/search/read and workspace
list/read/write. Every name the model supplies goes through the store, which checks it in
`agentmemory.paths` (UnsafeName for anything that could leave the agent's folder); here such
failures become error results the model can read."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentmemory import store
from chat.tools import Tool, ToolContext, ToolError, arg_str, tool_register

MEMORY_SEARCH_DEFAULT = 5
MEMORY_SEARCH_MAX = 20


def _guarded(fn: Callable[[ToolContext, dict[str, Any]], str]) -> Callable[..., str]:
    """Store errors as model-readable messages (the path itself is echoed, never resolved)."""

    def run(context: ToolContext, arguments: dict[str, Any]) -> str:
        try:
            return fn(context, arguments)
        except store.FolderNotOwned:
            raise ToolError("refused: this agent's memory folder is not available") from None
        except store.MemoryFull as exc:
            raise ToolError(f"refused: {exc}") from None
        except store.UnsafeName as exc:
            raise ToolError(f"refused: unsafe name ({exc})") from None
        except store.TooLarge as exc:
            raise ToolError(f"too large: {exc}") from None
        except store.MemoryNotFound as exc:
            raise ToolError(f"not found: {exc}") from None

    run.__name__ = fn.__name__
    return run


def _entry_json(entry: store.MemoryEntry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "content": entry.content,
        "tags": list(entry.tags),
        "updated": entry.updated.isoformat(timespec="seconds"),
    }


def _memory_write(context: ToolContext, arguments: dict[str, Any]) -> str:
    content = arg_str(arguments, "content")
    name = arg_str(arguments, "name", required=False) or None
    tags = arguments.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ToolError("tags must be a list of strings")
    try:
        result = store.entry_write(
            agent_id=context.agent_id,
            name=name,
            content=content,
            source_session_id=context.session_id,
            source_message_id=context.user_message_id,
            tags=[*tags, "agent"],
        )
    except (store.UnsafeName, store.TooLarge):
        raise
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    verb = "created" if result.created else "updated (it already existed)"
    return f"Memory entry {result.entry.name!r} {verb}."


def _memory_search(context: ToolContext, arguments: dict[str, Any]) -> str:
    query = arg_str(arguments, "query")
    limit = arguments.get("limit", MEMORY_SEARCH_DEFAULT)
    if type(limit) is not int or not 1 <= limit <= MEMORY_SEARCH_MAX:
        raise ToolError(f"limit must be an integer from 1 to {MEMORY_SEARCH_MAX}")
    hits = store.entry_search(agent_id=context.agent_id, query=query, limit=limit)
    return json.dumps(
        [{"score": round(score, 3), **_entry_json(entry)} for score, entry in hits],
        ensure_ascii=False,
    )


def _memory_read(context: ToolContext, arguments: dict[str, Any]) -> str:
    entry = store.entry_read(agent_id=context.agent_id, name=arg_str(arguments, "name"))
    return json.dumps(_entry_json(entry), ensure_ascii=False)


def _workspace_list(context: ToolContext, arguments: dict[str, Any]) -> str:
    return json.dumps(store.workspace_list(agent_id=context.agent_id))


def _workspace_read(context: ToolContext, arguments: dict[str, Any]) -> str:
    return store.workspace_read(agent_id=context.agent_id, path=arg_str(arguments, "path"))


def _workspace_write(context: ToolContext, arguments: dict[str, Any]) -> str:
    path = arg_str(arguments, "path")
    content = arg_str(arguments, "content")
    store.workspace_write(agent_id=context.agent_id, path=path, content=content)
    return f"Wrote {len(content)} characters to {path}."


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_PATH = {
    "type": "string",
    "description": "Relative path inside your workspace, e.g. notes/plan.md (no '..').",
}

BUILTIN_MEMORY_TOOLS = (
    Tool(
        name="memory_write",
        description=(
            "Save a durable fact to your long-term memory (one fact or topic per entry). "
            "Near-duplicates update the existing entry. Give `name` to overwrite a known entry."
        ),
        parameters=_object(
            {
                "content": {"type": "string", "description": "The fact, self-contained."},
                "name": {"type": "string", "description": "Optional entry name (slug)."},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            ["content"],
        ),
        handler=_guarded(_memory_write),
        builtin=True,
    ),
    Tool(
        name="memory_search",
        description="Search your long-term memory; best matches first, as JSON.",
        parameters=_object(
            {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": MEMORY_SEARCH_MAX},
            },
            ["query"],
        ),
        handler=_guarded(_memory_search),
        builtin=True,
    ),
    Tool(
        name="memory_read",
        description="Read one long-term memory entry by name.",
        parameters=_object({"name": {"type": "string"}}, ["name"]),
        handler=_guarded(_memory_read),
        builtin=True,
    ),
    Tool(
        name="workspace_list",
        description="List the files in your workspace folder.",
        parameters=_object({}, []),
        handler=_guarded(_workspace_list),
        builtin=True,
    ),
    Tool(
        name="workspace_read",
        description="Read a text file from your workspace folder.",
        parameters=_object({"path": _PATH}, ["path"]),
        handler=_guarded(_workspace_read),
        builtin=True,
    ),
    Tool(
        name="workspace_write",
        description="Create or replace a text file in your workspace folder.",
        parameters=_object({"path": _PATH, "content": {"type": "string"}}, ["path", "content"]),
        handler=_guarded(_workspace_write),
        builtin=True,
    ),
)


def register() -> None:
    for tool in BUILTIN_MEMORY_TOOLS:
        tool_register(tool)
