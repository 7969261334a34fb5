"""The contract's message object (SPEC, "API contract"): one function, used by the history API
(through MessageSerializer) and by every event that carries a message, so the two cannot
drift apart. Plain dict building: it runs for every event of every reply."""

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
