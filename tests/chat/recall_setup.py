"""What the recall tests (test_recall.py: the history_search tool; test_recall_auto.py: recall
in the payload) set up alike: a small budget, a fact planted in a session's first turn, and a
summary that passes the guard while dropping it, so only recall can bring the fact back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from cadau.contextconfig import ContextConfig
from chat.context import context_compact
from chat.context.compose import RecallAsk
from chat.models import Agent, ChatMessage, ChatSession, MessageRole
from tests.factories import ChatSessionFactory, make_conversation

SMALL = ContextConfig(
    input_budget_runes=4000, threshold_pct=60, target_pct=30, summary_max_runes=600, min_verbatim=2
)
# Passes the summary guard (every heading, shorter than what it replaces) and holds no fact.
FORGETFUL_SUMMARY = (
    "## Facts and decisions\n- The user asked many questions.\n## Open tasks\n- none\n"
    "## User constraints and preferences\n- none\n## Pending questions\n- none\n"
    "## Exact identifiers\n- none"
)
FACT = "Note for later: the door code is 4471-KX and the spare key is under the blue pot."


def recall_settings(settings, tmp_path) -> None:
    """The small budget, a runtime folder of its own, no memory files."""
    settings.RUNTIME_DIR = tmp_path
    settings.AGENT_MEMORY_STORAGE = ""
    settings.CHAT_CONTEXT = SMALL


def archived_session(
    owner, fake_llm, *, agent: Agent | None = None, fact: str = FACT
) -> tuple[ChatSession, int]:
    """A session whose first turn (`fact`) is summarised away by a summary that drops it: the
    session and the fact's message id."""
    session: ChatSession = ChatSessionFactory.create(owner=owner, agent=agent)
    planted = ChatMessage.objects.create(session=session, role=MessageRole.USER, content=fact)
    ChatMessage.objects.create(session=session, role=MessageRole.ASSISTANT, content="Noted.")
    make_conversation(session, turns=12, words=12)
    fake_llm.script_summary(FORGETFUL_SUMMARY)
    result = context_compact(session_id=session.pk, trigger="manual", force=True)
    assert result.outcome == "committed", result
    session.refresh_from_db()
    assert (session.verbatim_since_message_id or 0) > planted.pk
    assert "4471" not in session.context_summary
    return session, planted.pk


def send(api, session, content) -> dict:
    r = api.post("/api/v1/chat/send", {"session_id": session.pk, "content": content}, format="json")
    assert r.status_code == 200, r.content
    return r.json()


def last_reply(session) -> str:
    last = ChatMessage.objects.filter(session=session).order_by("-id").first()
    assert last is not None and last.role == MessageRole.ASSISTANT
    return last.content


def recall_ask(session, query, *, gap=(), room=2000) -> RecallAsk:
    """What the composer asks recall for `query` in `session`: its archive below the anchor."""
    return RecallAsk(
        session_id=session.pk,
        owner_id=session.owner_id,
        below_id=session.verbatim_since_message_id,
        gap=tuple(gap),
        query=query,
        context="",
        room=room,
        messages=ChatMessage.objects.filter(session=session).count(),
    )


def archived(owner, rows) -> ChatSession:
    """A session of `rows` ((role, content) pairs), all archived: the anchor is after them."""
    session: ChatSession = ChatSessionFactory.create(owner=owner)
    for role, content in rows:
        ChatMessage.objects.create(session=session, role=role, content=content)
    anchor = ChatMessage.objects.create(session=session, role=MessageRole.USER, content="anchor")
    session.verbatim_since_message_id = anchor.pk
    session.save()
    return session


@contextmanager
def statements_sent() -> Iterator[list[tuple[str, list]]]:
    """The statements sent on the default connection, each with its bound parameters (a plan
    asked with them is the one the database ran; CaptureQueriesContext gives them inlined)."""
    from django.db import connection

    statements: list[tuple[str, list]] = []

    def kept(execute, sql, params, many, context):
        statements.append((sql, list(params)))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(kept):
        yield statements
