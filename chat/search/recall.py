"""Recall: verbatim turns of a conversation that its summary may have lost, found again for the
model. Only messages older than the session's verbatim anchor are searched: everything from the
anchor on is in the payload already.

Two ways in:
- the `history_search` tool (built in, so on for agents unless their tool list leaves it out):
  the model asks, with words of its choosing;
- automatic recall (`CHAT_CONTEXT_RECALL`, off by default) for sessions whose model cannot call
  that tool: a system-prompt part that, for each new user message, adds the archived messages
  that best match it, under `CHAT_CONTEXT_RECALL_MAX_RUNES`. It is part of the system prompt, so
  the payload's size, the trimming and the send's `context_budget` all count it.

Both log `chat_context_recall source=tool|auto session=... hits=... runes=...`.

How "best" is found without embeddings: the whole text as a phrase first (an exact quote wins),
then its rarest-looking terms (identifiers, long words, three-character runs of Chinese), each
searched through the trigram index; a message scores the sum of its terms' weights, a term
weighing more the fewer messages it matches.
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

from chat.context.prompt import context_config_for, session_model
from chat.hooks import PromptPart, system_prompt_hooks
from chat.llm.window import window_learned
from chat.models import Agent, ChatMessage, ChatSession
from chat.search.backends import Scope
from chat.search.selectors import (
    QUERY_MAX_CHARS,
    message_ids_search,
    search_deadline,
)
from chat.tools import Tool, ToolContext, ToolError, arg_str, tool_register, tools_enabled_for

logger = logging.getLogger("chat.search")

TOOL_NAME = "history_search"
TERMS_MAX = 6
# Matches asked for per term: enough to tell a rare term from a common one.
_TERM_HITS = 30
# What one message may contribute: a long message is cut around its match.
EXCERPT_RUNES = 700
MESSAGES_MAX = 8
# What excerpts_render adds per excerpt (its header line), counted against the cap.
_HEADER_RUNES = 50
# Recall runs before the model call; it never holds a send for long.
RECALL_SECONDS = 2.0

_LATIN = re.compile(r"[0-9A-Za-z_](?:[0-9A-Za-z_.:/#@-]*[0-9A-Za-z_])?")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_IDENTIFIER = re.compile(r"[0-9_.:/#@-]")
_STOPWORD_TEXT = (
    "the and for you are was were not but can all any had has have his her our out who how "
    "why what which when where that this these those with from your about there their would "
    "could should been they them then than into does did tell remember said earlier before "
    "again please know just like also some more most very will shall may might must its "
    "let give get got want need thing things told say says conversation chat message messages"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
# Chinese function characters: a three-character run holding one is rarely a topic.
_CJK_STOP = frozenset("的了是我你他她它们吗呢吧啊什么多少在有和与这那个就也都要说过还请问")


@dataclass(frozen=True, slots=True)
class Excerpt:
    message_id: int
    role: str
    created_at: datetime
    text: str


def recall_terms(text: str) -> list[str]:
    """The words of `text` worth searching for, most distinctive first: identifiers (digits,
    dashes, dots), then longer words, then Chinese three-character runs."""
    latin: list[str] = []
    for match in _LATIN.finditer(text):
        word = match.group(0)
        if len(word) < 3 or word.lower() in _STOPWORDS:
            continue
        latin.append(word)
    latin.sort(key=lambda w: (not _IDENTIFIER.search(w), -len(w)))
    chinese: list[str] = []
    for run in _CJK.findall(text):
        grams = [run[i : i + 3] for i in range(len(run) - 2)]
        chinese.extend(g for g in grams if not set(g) & _CJK_STOP)
    seen: set[str] = set()
    terms = []
    for term in latin + chinese:
        key = term.casefold()
        if key not in seen:
            seen.add(key)
            terms.append(term)
    return terms[:TERMS_MAX]


def recall_search(
    *,
    session_id: int,
    owner_id: int,
    below_id: int,
    text: str,
    max_messages: int = MESSAGES_MAX,
    max_runes: int,
) -> list[Excerpt]:
    """The session's messages older than `below_id` that best match `text`, as verbatim
    excerpts in conversation order, together at most `max_runes` runes."""
    scope = Scope(owner_id=owner_id, session_id=session_id, below_id=below_id)
    scores: dict[int, float] = defaultdict(float)
    matched_by: dict[int, str] = {}
    phrase = " ".join(text.split())
    if 1 <= len(phrase) <= QUERY_MAX_CHARS:
        for message_id in message_ids_search(scope=scope, query=phrase, limit=max_messages).ids:
            scores[message_id] += 100.0
            matched_by.setdefault(message_id, phrase)
    for term in recall_terms(text):
        if term.casefold() == phrase.casefold():
            continue
        ids = message_ids_search(scope=scope, query=term, limit=_TERM_HITS).ids
        if not ids:
            continue
        weight = (2.0 if _IDENTIFIER.search(term) else 1.0) / math.sqrt(len(ids))
        for message_id in ids:
            scores[message_id] += weight
            matched_by.setdefault(message_id, term)
    best = sorted(scores, key=lambda mid: (-scores[mid], -mid))[:max_messages]
    rows = ChatMessage.objects.filter(id__in=best).values_list(
        "id", "role", "created_at", "content"
    )
    excerpts = []
    left = max_runes
    # Spend the rune cap on the best matches first, then show them in conversation order.
    by_id = {row[0]: row for row in rows}
    for message_id in best:
        if message_id not in by_id or left <= 0:
            continue
        _, role, created_at, content = by_id[message_id]
        piece = _excerpt(content, around=matched_by[message_id], runes=min(EXCERPT_RUNES, left))
        left -= len(piece) + _HEADER_RUNES
        excerpts.append(
            Excerpt(message_id=message_id, role=role, created_at=created_at, text=piece)
        )
    excerpts.sort(key=lambda e: e.message_id)
    return excerpts


def _excerpt(content: str, *, around: str, runes: int) -> str:
    """`content` verbatim when it fits, else `runes` of it centred on the first `around`."""
    if len(content) <= runes:
        return content
    at = content.casefold().find(around.casefold())
    start = max(0, min(at - runes // 3, len(content) - runes)) if at >= 0 else 0
    body = content[start : start + max(1, runes - 2)]
    return ("…" if start > 0 else "") + body + ("…" if start + len(body) < len(content) else "")


def excerpts_render(excerpts: list[Excerpt]) -> str:
    return "\n\n".join(
        f"[message {e.message_id} · {e.role} · {e.created_at:%Y-%m-%d %H:%M} UTC]\n{e.text}"
        for e in excerpts
    )


def _recall_timed(*, source: str, **search: Any) -> list[Excerpt]:
    """`recall_search` under the recall deadline, logged. Raises what the search raises."""
    with search_deadline(RECALL_SECONDS):
        excerpts = recall_search(**search)
    logger.info(
        "chat_context_recall source=%s session=%s hits=%d runes=%d",
        source,
        search["session_id"],
        len(excerpts),
        sum(len(e.text) for e in excerpts),
    )
    return excerpts


# --- the history_search tool -------------------------------------------------------------


def _history_search(context: ToolContext, arguments: dict[str, Any]) -> str:
    query = arg_str(arguments, "query").strip()
    if not query:
        raise ToolError("give the words to look for in 'query'")
    if len(query) > QUERY_MAX_CHARS:
        raise ToolError(f"'query' is at most {QUERY_MAX_CHARS} characters")
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
        excerpts = _recall_timed(
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
    return f"Found {len(excerpts)} earlier message(s), verbatim:\n\n" + excerpts_render(excerpts)


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


# --- automatic recall --------------------------------------------------------------------

# Below this (heading included), excerpts would be too short to be worth it: no recall.
MIN_RECALL_RUNES = 300

RECALL_HEADING = (
    "Earlier messages of this conversation that match the user's new message (verbatim; "
    "they are older than the summary's end):"
)


def _model_can_search(agent: Agent | None) -> bool:
    if agent is None:
        return False
    return any(tool.name == TOOL_NAME for tool in tools_enabled_for(config=agent.config_json))


def recall_prompt_part(*, session: ChatSession) -> PromptPart | None:
    """The system-prompt hook of automatic recall: None when it is off, when nothing is
    summarised yet, or when the model can search itself. Searches once per message (the send
    renders the prompt for the same message more than once) and never fails a send."""
    anchor = session.verbatim_since_message_id
    if not settings.CHAT_CONTEXT_RECALL or anchor is None or _model_can_search(session.agent):
        return None
    cap = recall_cap(session=session)
    if cap < MIN_RECALL_RUNES:
        return None
    rendered: dict[str, str] = {}

    def render(query: str) -> str:
        if not query.strip():
            return ""  # the budget between sends: no message, nothing recalled
        if query not in rendered:
            rendered.clear()
            rendered[query] = _recall_text(session=session, anchor=anchor, query=query, cap=cap)
        return rendered[query]

    return render


def recall_cap(*, session: ChatSession) -> int:
    """The runes automatic recall may add: CHAT_CONTEXT_RECALL_MAX_RUNES, but never more than a
    tenth of the session's input limit, nor of the model's window where it is known (counted at
    two tokens a character, Chinese's worst case). Recall is an extra: it must not push verbatim
    turns out of the payload, nor a prompt past a small model's window."""
    cfg = context_config_for(session=session)
    cap = min(settings.CHAT_CONTEXT_RECALL_MAX_RUNES, cfg.effective_hard_limit_runes // 10)
    window = cfg.window_tokens or window_learned(model=session_model(session=session))
    if window:
        cap = min(cap, window // 20)
    return cap


def _recall_text(*, session: ChatSession, anchor: int, query: str, cap: int) -> str:
    try:
        excerpts = _recall_timed(
            source="auto",
            session_id=session.pk,
            owner_id=session.owner_id,
            below_id=anchor,
            text=query,
            max_messages=MESSAGES_MAX,
            max_runes=cap - len(RECALL_HEADING) - 2,
        )
    except Exception:
        logger.warning("chat_context_recall_failed session=%s", session.pk, exc_info=True)
        return ""
    if not excerpts:
        return ""
    return f"{RECALL_HEADING}\n\n{excerpts_render(excerpts)}"


def register() -> None:
    """Called from ChatConfig.ready(); importing this module registered the tool already."""
    if recall_prompt_part not in system_prompt_hooks:
        system_prompt_hooks.append(recall_prompt_part)
