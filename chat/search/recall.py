"""Recall: verbatim turns of a conversation that its summary may have lost, found again for the
model. Only messages older than the session's verbatim anchor are searched: everything from the
anchor on is in the payload already.

Two ways in:
- the `history_search` tool (built in, so on for agents unless their tool list leaves it out):
  the model asks, with words of its choosing;
- automatic recall (`CHAT_CONTEXT_RECALL`, on by default, chat/search/recall_auto.py) for every
  session: the payload's free room filled with the turns that best match the new message.

Both log `chat_context_recall source=tool|auto session=... hits=... runes=...`.

How the tool finds "best" without embeddings: a message with no distinctive term ("ok", "?") recalls
nothing; otherwise the whole text as a phrase (an exact quote wins) when it is long enough to
be one, then its most distinctive terms (chat/search/terms.py), each searched through the
index; a message scores the sum of its terms' weights, a term weighing more the fewer messages
it matches. Replies the model is never sent (streaming, failed) are never recalled.

What comes back is quoted: a header line per message, then its text with "> " before every
line. Recalled text is material for the model, never instructions, and a message's own text
cannot pass for one of our headers.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from chat.errors import InvalidInput
from chat.models import EXCLUDED_FROM_MODEL, ChatMessage, ChatSession, MessageRole
from chat.search.backends import Scope
from chat.search.selectors import (
    QUERY_MAX_CHARS,
    message_ids_search,
    search_deadline,
    search_query_clean,
)
from chat.search.terms import recall_terms, term_is_identifier
from chat.text import quoted
from chat.tools import Tool, ToolContext, ToolError, arg_str, tool_register

logger = logging.getLogger("chat.search")

TOOL_NAME = "history_search"
# Matches asked for per term: enough to tell a rare term from a common one.
_TERM_HITS = 30
# The whole message is searched as a phrase only from this length: a short one ("ok", "yes")
# is a substring of unrelated messages ("book", "yesterday") and would score as a quote.
PHRASE_MIN_CHARS = 8
# What one message may contribute: a long message is cut around its match.
EXCERPT_RUNES = 700
# A cut shorter than this is not worth its header: the next match may fit whole instead.
_EXCERPT_MIN_RUNES = 40
MESSAGES_MAX = 8
# Recall runs before the model call; it never holds a send for long.
RECALL_SECONDS = 2.0
_SEPARATOR = "\n\n"


@dataclass(frozen=True, slots=True)
class Excerpt:
    message_id: int
    role: str
    created_at: datetime
    text: str  # verbatim (cut around the match when long); quoted only when rendered


def recall_search(
    *,
    session_id: int,
    owner_id: int,
    below_id: int,
    text: str,
    max_messages: int = MESSAGES_MAX,
    max_runes: int,
    with_tool_results: bool = True,
) -> list[Excerpt]:
    """The session's messages older than `below_id` that best match `text`, as excerpts in
    conversation order, together at most `max_runes` runes once rendered (`excerpts_render`).
    Never a reply the model is not sent (streaming, failed); tool results only when
    `with_tool_results`. Nothing for a text without a distinctive term ("ok", "?")."""
    terms = recall_terms(text)
    if not terms:
        return []
    scope = Scope(owner_id=owner_id, session_id=session_id, below_id=below_id)
    scores: dict[int, float] = defaultdict(float)
    matched_by: dict[int, str] = {}
    phrase = " ".join(text.split())
    searched: set[str] = set()
    if PHRASE_MIN_CHARS <= len(phrase) <= QUERY_MAX_CHARS:
        searched.add(phrase.casefold())
        for message_id in message_ids_search(scope=scope, query=phrase, limit=max_messages).ids:
            scores[message_id] += 100.0  # an exact quote wins over any sum of terms
            matched_by.setdefault(message_id, phrase)
    for term in terms:
        if term.casefold() in searched:  # a one-word message: its phrase was that word
            continue
        ids = message_ids_search(scope=scope, query=term, limit=_TERM_HITS).ids
        if not ids:
            continue
        weight = (2.0 if term_is_identifier(term) else 1.0) / math.sqrt(len(ids))
        for message_id in ids:
            scores[message_id] += weight
            matched_by.setdefault(message_id, term)
    if not scores:
        return []
    # The search's scope leaves out only streaming replies (chat/search/backends.py); a failed
    # reply is never sent to the model either, so it must not come back through recall. Ids
    # only, over every candidate: filtering the chosen few after the cut would return fewer.
    sendable = ChatMessage.objects.filter(id__in=list(scores)).exclude(
        status__in=EXCLUDED_FROM_MODEL
    )
    if not with_tool_results:
        sendable = sendable.exclude(role=MessageRole.TOOL)
    kept = set(sendable.values_list("id", flat=True))
    best = sorted(kept, key=lambda mid: (-scores[mid], -mid))[:max_messages]
    rows = ChatMessage.objects.filter(id__in=best).values_list(
        "id", "role", "created_at", "content"
    )
    by_id = {row[0]: row for row in rows}
    excerpts: list[Excerpt] = []
    left = max_runes
    # Spend the rune cap on the best matches first, then show them in conversation order. Each
    # excerpt is charged what it adds to the rendering exactly: the separator before it (the
    # first has none), its header line and its quoted text.
    for message_id in best:
        if message_id not in by_id:  # deleted (truncated) between the two reads
            continue
        _, role, created_at, content = by_id[message_id]
        header = _header(message_id=message_id, role=role, created_at=created_at)
        room = left - len(header) - 1 - (len(_SEPARATOR) if excerpts else 0)
        piece = _excerpt_fitted(content, around=matched_by[message_id], room=room)
        if piece is None:
            continue
        left = room - len(quoted(piece))
        excerpts.append(
            Excerpt(message_id=message_id, role=role, created_at=created_at, text=piece)
        )
    excerpts.sort(key=lambda e: e.message_id)
    return excerpts


def _excerpt_fitted(content: str, *, around: str, room: int) -> str | None:
    """The longest excerpt of `content` (at most EXCERPT_RUNES) whose quoted form fits in
    `room`; None when only a cut under _EXCERPT_MIN_RUNES would."""
    if len(content) <= EXCERPT_RUNES and len(quoted(content)) <= room:
        return content
    # As snippets.py does: an offset found in content.casefold() is not one in `content`
    # (casefold changes lengths: ß is ss), and the cut would miss the match.
    match = re.search(re.escape(around), content, re.IGNORECASE)
    at = match.start() if match is not None else -1
    # Quoting adds two runes a line, so the rendered size is not the cut's: search the
    # longest cut that fits (the size grows with the cut, give or take a line).
    low, high = _EXCERPT_MIN_RUNES, min(EXCERPT_RUNES, room)
    found = None
    while low <= high:
        runes = (low + high) // 2
        piece = _cut(content, at=at, runes=runes)
        if len(quoted(piece)) <= room:
            found, low = piece, runes + 1
        else:
            high = runes - 1
    return found


def cut_around(content: str, *, around: str, runes: int) -> str:
    """`content` verbatim when it is at most `runes` long, else `runes` of it with the first
    match of `around` a third of the way in."""
    if len(content) <= runes:
        return content
    match = re.search(re.escape(around), content, re.IGNORECASE) if around else None
    return _cut(content, at=match.start() if match is not None else -1, runes=runes)


def _cut(content: str, *, at: int, runes: int) -> str:
    """`content` verbatim when it fits, else `runes` of it (ellipses included) with the match
    at `at` a third of the way in (the start when `at` is -1)."""
    if len(content) <= runes:
        return content
    runes = max(runes, 3)
    start = max(0, at - runes // 3)
    if start == 0:
        return content[: runes - 1] + "…"
    # An ellipsis only at the ends that are cut: a window reaching the message's end keeps its
    # last characters (where the match may be).
    if start + runes - 1 >= len(content):
        return "…" + content[len(content) - runes + 1 :]
    return "…" + content[start : start + runes - 2] + "…"


def _header(*, message_id: int, role: str, created_at: datetime) -> str:
    return f"[message {message_id} · {role} · {created_at:%Y-%m-%d %H:%M} UTC]"


def excerpts_render(excerpts: list[Excerpt]) -> str:
    """The excerpts as the model reads them: for each, its header, then its text quoted."""
    return _SEPARATOR.join(
        _header(message_id=e.message_id, role=e.role, created_at=e.created_at)
        + "\n"
        + quoted(e.text)
        for e in excerpts
    )


def _recall_run(*, source: str, **search: Any) -> list[Excerpt]:
    """`recall_search` under the recall deadline, logged. Raises what the search raises."""
    with search_deadline(RECALL_SECONDS):
        excerpts = recall_search(**search)
    logger.info(
        "chat_context_recall source=%s session=%s hits=%d runes=%d",
        source,
        search["session_id"],
        len(excerpts),
        len(excerpts_render(excerpts)),
    )
    return excerpts


# --- the history_search tool -------------------------------------------------------------


def _history_search(context: ToolContext, arguments: dict[str, Any]) -> str:
    # The search API's own rules (length, no NUL, no lone surrogate): a query the database
    # cannot take is the model's to fix, not an opaque "search failed".
    try:
        query = search_query_clean(arg_str(arguments, "query"))
    except InvalidInput as exc:
        raise ToolError(f"'query' refused: {exc.message}") from exc
    limit = arguments.get("limit", 5)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MESSAGES_MAX:
        raise ToolError(f"'limit' is a whole number from 1 to {MESSAGES_MAX}")
    # The tool acts for the session's owner only: the context names both, and a session that is
    # not theirs (it cannot happen through a send) finds nothing.
    anchor = (
        ChatSession.objects.filter(pk=context.session_id, owner_id=context.user_id)
        .values_list("verbatim_since_message_id", flat=True)
        .first()
    )
    if anchor is None:
        return (
            "Nothing in this conversation has been summarised yet: every message of it is "
            "already in your context."
        )
    try:
        excerpts = _recall_run(
            source="tool",
            session_id=context.session_id,
            owner_id=context.user_id,
            below_id=anchor,
            text=query,
            max_messages=limit,
            max_runes=settings.HISTORY_SEARCH_MAX_RUNES,
        )
    except Exception as exc:  # a timeout or a database error is the model's to read
        raise ToolError(f"the search failed ({type(exc).__name__}); try other words") from exc
    if not excerpts:
        return "No earlier message matches; try other words, or fewer of them."
    return (
        f"Found {len(excerpts)} earlier message(s), each a header line, then its text quoted "
        'verbatim ("> " before every line):\n\n' + excerpts_render(excerpts)
    )


HISTORY_SEARCH = tool_register(
    Tool(
        name=TOOL_NAME,
        description=(
            "Search this conversation's earlier messages that are no longer in your context "
            "(only their summary is). Returns them verbatim with their message ids. Use it when "
            "the user refers to something said long ago that the summary does not hold."
        ),
        parameters={
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "Words or an exact phrase from the message to find.",
                },
                "limit": {"type": "integer", "minimum": 1, "maximum": MESSAGES_MAX},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        handler=_history_search,
        builtin=True,
    )
)


def register() -> None:
    """Called from ChatConfig.ready(): importing this module registered the tool."""
