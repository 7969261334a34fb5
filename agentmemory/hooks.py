"""agentmemory's implementations of chat's extension points (chat.hooks), registered by
`register()` from AgentMemoryConfig.ready(). All are no-ops for sessions without an agent."""

from __future__ import annotations

import logging
from typing import Any

from agentmemory import store
from agentmemory.clock import agent_now
from agentmemory.flush import NOTE_MESSAGE_MAX_RUNES, memory_flush_before_compaction, note_line
from agentmemory.folders import agent_known
from agentmemory.remember import remember_parse, remember_resolve
from agentmemory.selectors import user_messages_recent
from agentmemory.text import entry_title
from chat import hooks
from chat.hooks import PromptPart
from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.services.agents import agent_settings
from chat.shapes import memory_event

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
        # The name is a file name (ASCII, safe); the title is what the page shows.
        "title": entry_title(entry.content),
        "content": entry.content,
        "tags": list(entry.tags),
        "created": entry.created.isoformat().replace("+00:00", "Z"),
        "updated": entry.updated.isoformat().replace("+00:00", "Z"),
        "source_session_id": entry.source_session_id,
        "source_message_id": entry.source_message_id,
    }


def memory_prompt_part(*, session: ChatSession) -> PromptPart | None:
    """The system-prompt hook: the agent's entries, read once, rendered per user message within
    the agent's `memory_prompt_runes` cap (heading included). Order: BM25 relevance to the
    message, then newest."""
    agent = session.agent
    if agent is None:
        return None
    runes = agent_settings(agent=agent, capped=not session.owner.is_staff).memory_prompt_runes
    cap = runes - len(MEMORY_PROMPT_HEADING) - 2
    if cap <= 0:
        return None
    try:
        with agent_known(agent):
            entries = store.entry_list(agent_id=agent.pk)
    except (OSError, ValueError):
        # Memory is an aid; an unreadable store must not make the chat unusable.
        logger.exception("agent_memory_prompt_failed session=%s agent=%s", session.pk, agent.pk)
        return None
    if not entries:
        return None

    def render(query: str) -> str:
        listing = store.entries_prompt_text(entries=entries, query=query or "", max_runes=cap)
        return f"{MEMORY_PROMPT_HEADING}\n\n{listing}" if listing else ""

    return render


def memory_remember_on_turn(
    *, session: ChatSession, user_message: ChatMessage | None
) -> list[dict[str, Any]]:
    """An explicit "remember ..." / "记住..." in the user's message becomes an entry now, before
    the reply is generated (so the reply's system prompt already carries it)."""
    agent = session.agent
    if agent is None or user_message is None:
        return []
    ask = remember_parse(user_message.content)
    if ask is None:
        return []
    # "remember my name" / "remember that": what it points at, said before.
    fact = remember_resolve(
        ask,
        earlier=lambda: user_messages_recent(session_id=session.pk, before_id=user_message.pk),
    )
    if fact is None:
        return []
    try:
        with agent_known(agent):
            result = store.entry_write(
                agent_id=agent.pk,
                name=None,
                content=fact,
                source_session_id=session.pk,
                source_message_id=user_message.pk,
                tags=["remembered"],
            )
    except ValueError as exc:  # too long, empty after cleaning, memory full, folder refused
        logger.warning(
            "agent_memory_remember_failed session=%s message=%s error=%s",
            session.pk,
            user_message.pk,
            exc,
        )
        return [memory_event(action="remember_failed", error=str(exc)[:300])]
    logger.info(
        "agent_memory_remembered session=%s agent=%s message=%s entry=%s created=%s",
        session.pk,
        agent.pk,
        user_message.pk,
        result.entry.name,
        result.created,
    )
    return [
        memory_event(
            action="remembered",
            created=result.created,
            message_id=user_message.pk,
            entry=entry_payload(result.entry),
        )
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
    now = agent_now(agent=agent)
    turn = [user_message, assistant_message] if user_message is not None else [assistant_message]
    lines = [note_line(m, clip=NOTE_MESSAGE_MAX_RUNES) for m in turn]
    with agent_known(agent):
        store.daily_note_append(
            agent_id=agent.pk,
            day=now.date(),
            heading=f"Turn · {now:%H:%M %Z} · session {session.pk}",
            body="\n\n".join(lines),
        )


def register() -> None:
    """Idempotent: ready() can run more than once (tests, some management commands)."""
    for registry, fn in (
        (hooks.pre_compaction_hooks, memory_flush_before_compaction),
        (hooks.system_prompt_hooks, memory_prompt_part),
        (hooks.turn_started_hooks, memory_remember_on_turn),
        (hooks.turn_finished_hooks, memory_auto_append),
    ):
        if fn not in registry:
            registry.append(fn)  # type: ignore[arg-type]
