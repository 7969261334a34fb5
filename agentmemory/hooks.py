"""agentmemory's implementations of chat's extension points (chat.services.hooks), registered by
`register()` from AgentMemoryConfig.ready(). All are no-ops for sessions without an agent."""

from __future__ import annotations

import logging
from typing import Any

from django.utils import timezone

from agentmemory import store
from agentmemory.flush import clip_text, memory_flush_before_roll
from agentmemory.remember import remember_request
from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.services import hooks
from chat.services.agents import agent_settings

logger = logging.getLogger("agentmemory.hooks")

MEMORY_PROMPT_HEADING = (
    "## Long-term memory\n"
    "What you have been asked to remember or learned in earlier conversations with this user "
    "(most relevant first). Use it; do not mention this list unless asked."
)


def entry_payload(entry: store.MemoryEntry) -> dict[str, Any]:
    """The API's and the events' entry object."""
    return {
        "name": entry.name,
        "content": entry.content,
        "tags": list(entry.tags),
        "created": entry.created.isoformat().replace("+00:00", "Z"),
        "updated": entry.updated.isoformat().replace("+00:00", "Z"),
        "source_session_id": entry.source_session_id,
        "source_message_id": entry.source_message_id,
    }


def memory_system_prompt(*, session: ChatSession, query: str = "") -> str:
    """Long-term entries for the system prompt, within the agent's `memory_prompt_runes` cap
    (heading included). Order: BM25 relevance to the user's message, then newest."""
    agent = session.agent
    if agent is None:
        return ""
    cap = agent_settings(agent=agent).memory_prompt_runes - len(MEMORY_PROMPT_HEADING) - 2
    if cap <= 0:
        return ""
    try:
        listing = store.entries_for_prompt(agent_id=agent.pk, query=query or "", max_runes=cap)
    except (OSError, ValueError):
        # Memory is an aid; an unreadable store must not make the chat unusable.
        logger.exception("agent_memory_prompt_failed session=%s agent=%s", session.pk, agent.pk)
        return ""
    return f"{MEMORY_PROMPT_HEADING}\n\n{listing}" if listing else ""


def memory_remember_on_turn(
    *, session: ChatSession, user_message: ChatMessage | None
) -> list[dict[str, Any]]:
    """An explicit "remember ..." / "记住..." in the user's message becomes an entry now, before
    the reply is generated (so the reply's system prompt already carries it)."""
    agent = session.agent
    if agent is None or user_message is None:
        return []
    fact = remember_request(user_message.content)
    if fact is None:
        return []
    try:
        result = store.entry_write(
            agent_id=agent.pk,
            name=None,
            content=fact,
            source_session_id=session.pk,
            source_message_id=user_message.pk,
            tags=["remembered"],
        )
    except ValueError as exc:  # too long, empty after cleaning
        logger.warning(
            "agent_memory_remember_failed session=%s message=%s error=%s",
            session.pk,
            user_message.pk,
            exc,
        )
        return [{"type": "memory", "action": "remember_failed", "error": str(exc)[:300]}]
    logger.info(
        "agent_memory_remembered session=%s agent=%s message=%s entry=%s created=%s",
        session.pk,
        agent.pk,
        user_message.pk,
        result.entry.name,
        result.created,
    )
    return [
        {
            "type": "memory",
            "action": "remembered",
            "created": result.created,
            "message_id": user_message.pk,
            "entry": entry_payload(result.entry),
        }
    ]


def memory_auto_append(
    *, session: ChatSession, user_message: ChatMessage | None, assistant_message: ChatMessage
) -> None:
    """With `memory_auto_append` on, every finished turn also goes to the daily note."""
    agent = session.agent
    if agent is None or not agent_settings(agent=agent).memory_auto_append:
        return
    if assistant_message.status != MessageStatus.COMPLETE:
        return
    now = timezone.localtime()
    lines = []
    if user_message is not None:
        lines.append(
            f"**user** (#{user_message.pk}): "
            + clip_text(
                user_message.content, 8000, session_id=session.pk, message_id=user_message.pk
            )
        )
    lines.append(
        f"**assistant** (#{assistant_message.pk}): "
        + clip_text(
            assistant_message.content, 8000, session_id=session.pk, message_id=assistant_message.pk
        )
    )
    store.daily_note_append(
        agent_id=agent.pk,
        day=now.date(),
        heading=f"Turn · {now:%H:%M %Z} · session {session.pk}",
        body="\n\n".join(lines),
    )


def register() -> None:
    """Idempotent: ready() can run more than once (tests, some management commands)."""
    for registry, fn in (
        (hooks.pre_roll_hooks, memory_flush_before_roll),
        (hooks.system_prompt_hooks, memory_system_prompt),
        (hooks.turn_started_hooks, memory_remember_on_turn),
        (hooks.turn_finished_hooks, memory_auto_append),
    ):
        if fn not in registry:
            registry.append(fn)  # type: ignore[arg-type]
