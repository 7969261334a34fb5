"""The contract's objects (docs/api.md): the message object, used by the history API (through
MessageSerializer) and by every event that carries a message, so the two cannot drift apart,
and every event a client receives. Plain dict building: it runs for every event of every reply."""

from __future__ import annotations

from typing import Any

from chat.models import ChatMessage

# Metadata kept for operators (the admin, logs), never shown to users or programs: the text a
# model server answered with can name hosts, keys' owners and internal errors.
INTERNAL_METADATA = frozenset({"error_detail"})


def message_payload(message: ChatMessage) -> dict[str, Any]:
    return {
        "id": message.pk,
        "session_id": message.session_id,
        "role": message.role,
        "content": message.content,
        "status": message.status,
        "created_at": message.created_at.isoformat().replace("+00:00", "Z"),
        "client_id": message.client_id,
        "tool_calls": message.tool_calls,
        # Stored as "" when absent (a CharField); the contract says null.
        "tool_call_id": message.tool_call_id or None,
        "metadata": (
            {k: v for k, v in message.metadata.items() if k not in INTERNAL_METADATA}
            if INTERNAL_METADATA.intersection(message.metadata)
            else message.metadata
        ),
    }


# --- the contract's events --------------------------------------------------------------------
# Every event a client can receive is built here and nowhere else (REST server-sent events and
# WebSocket frames carry the same objects; docs/api.md lists them). Plain dicts: they are built
# for every token of every reply, and orjson / json encode them as they are.

Event = dict[str, Any]
FINAL_STATUSES = frozenset({"complete", "failed", "cancelled"})


def message_event(*, message: dict[str, Any]) -> Event:
    """A stored message (a send's user message), or a reply still streaming with its partial
    text: the client appends the `delta`s that follow to it."""
    return {"type": "message", "message": message}


def delta_event(
    *, message_id: int, text: str, offset: int, emitted_at: float | None = None
) -> Event:
    """The next piece of a reply. `offset` is where `text` starts in the reply's content, so a
    client that resumed with a partial drops what it already holds. `emitted_at`: the model
    server's own emit time of the chunk, when it reports one (lets a client measure the
    latency this server adds)."""
    event: Event = {"type": "delta", "message_id": message_id, "text": text, "offset": offset}
    if emitted_at is not None:
        event["emitted_at"] = emitted_at
    return event


def done_event(*, message: dict[str, Any], context_budget: dict[str, Any] | None) -> Event:
    """The end of a reply: the stored row in its final status. A row still `streaming` is a
    programming error, refused here so no transport can announce an unfinished reply as done
    (a repeated client_id once did, over server-sent events)."""
    if message.get("status") not in FINAL_STATUSES:
        raise ValueError(f"done must carry a final reply, not {message.get('status')!r}")
    return {"type": "done", "message": message, "context_budget": context_budget}


def error_event(*, code: str, message: str, retry_after: int | None = None) -> Event:
    """A refusal or a failed reply. `retry_after`: seconds, for a limit's refusal (as the REST
    API's Retry-After header)."""
    event: Event = {"type": "error", "code": code, "message": message}
    if retry_after is not None:
        event["retry_after"] = retry_after
    return event


def compaction_started_event() -> Event:
    return {"type": "compaction", "state": "started"}


def compaction_ended_event(
    *, state: str, outcome: str, messages_rolled: int, context_budget: dict[str, Any] | None
) -> Event:
    """The end of a compaction: its state, the outcome it stands for (so a page can say what
    happened), and the budget afterwards (so the usage ring never waits for the next reply)."""
    event: Event = {
        "type": "compaction",
        "state": state,
        "outcome": outcome,
        "messages_rolled": messages_rolled,
    }
    if context_budget is not None:
        event["context_budget"] = context_budget
    return event


def title_event(*, session_id: int, title: str) -> Event:
    return {"type": "title", "session_id": session_id, "title": title}


def tool_call_event(*, message: dict[str, Any]) -> Event:
    """An assistant row with `tool_calls`: one round of the agent's tool loop."""
    return {"type": "tool_call", "message": message}


def tool_result_event(*, message: dict[str, Any], tool: str, is_error: bool) -> Event:
    """The stored `tool` row answering one call."""
    return {"type": "tool_result", "message": message, "tool": tool, "is_error": is_error}


def memory_event(*, action: str, **fields: Any) -> Event:
    """What the memory hooks did on a turn ("remembered", "remember_failed")."""
    return {"type": "memory", "action": action, **fields}
