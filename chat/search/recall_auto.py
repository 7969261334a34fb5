"""Automatic recall: the turns of a conversation that best match the user's new message, found
for the payload composer (chat/context/compose.py) before every model call, for every session.

Where from: the archive (messages older than the session's anchor, found through the search
index, chat/search/selectors.py) and the gap (verbatim-tail messages the composer did not keep
in the payload's core, already in memory: scored here without a query).

How "best" is found without embeddings (lexical, BM25-like):
- the terms of the new message (chat/search/terms.py), and at half weight those of the turn
  before it, since a question says "that" for something named a turn before; a long word is
  also searched by its stem ("painting" finds "painted"), the index matching substrings;
- a term weighs log(1 + messages / matches): a rare term says more than a common one;
  identifiers (digits, dashes) twice as much; the whole message found as a phrase wins;
- each hit brings the turn next to it at half its score: a question's answer (or the question
  an answer needs) rarely repeats the question's words.
With an embedding model configured, the messages nearest the query's meaning
(chat/search/semantic.py) join the ranking by reciprocal-rank fusion: "what pets does she
have?" finds "we got another cat", which shares no word with it.
Replies the model is never sent (streaming, failed) and tool results (text fetched from outside,
the likeliest carrier of an injection) are never recalled. Each search runs under the recall
deadline; a slow or failing one adds nothing and never fails a send.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable

from django.db import connection

from chat.context.compose import RecallAsk, Recalled, recall_piece_runes, recall_render
from chat.context.state import TailMessage
from chat.models import EXCLUDED_FROM_MODEL, ChatMessage, MessageRole
from chat.search.backends import Scope
from chat.search.recall import PHRASE_MIN_CHARS, RECALL_SECONDS, cut_around
from chat.search.selectors import QUERY_MAX_CHARS, message_ids_search, search_deadline
from chat.search.semantic import rank_fuse, semantic_ranking
from chat.search.terms import recall_terms, term_is_identifier, term_stem

logger = logging.getLogger("chat.search")

TERMS_MAX = 10
CONTEXT_TERMS_MAX = 4
# Matches asked of the index per term: enough to tell a rare term from a common one, and to
# find a rare one's every use.
TERM_HITS = 60
# Hits whose neighbours are looked up (one statement): the best ones, which the room can hold.
NEIGHBOURED_MAX = 120
NEIGHBOUR_SHARE = 0.5
PHRASE_BONUS = 100.0
# What one recalled message may take: a long one is cut around its match.
EXCERPT_RUNES = 1200
_ROLES = (MessageRole.USER, MessageRole.ASSISTANT)


def _weighted_terms(ask: RecallAsk) -> dict[str, float]:
    terms: dict[str, float] = {}
    for text, weight, most in ((ask.query, 1.0, TERMS_MAX), (ask.context, 0.5, CONTEXT_TERMS_MAX)):
        for term in recall_terms(text, most=most):
            for variant in dict.fromkeys((term, term_stem(term))):
                terms.setdefault(variant.casefold(), weight)
    return terms


def _gap_hits(gap: Iterable[TailMessage], term: str) -> list[int]:
    return [m.id for m in gap if m.role in _ROLES and term in m.content.casefold()]


def recall_auto(ask: RecallAsk) -> list[Recalled]:
    """The best matches of `ask`, with their neighbours, fitted to `ask.room` once rendered, in
    conversation order. Logs `chat_context_recall source=auto`."""
    # Apart from the lexical search's deadline: its own failure leaves lexical recall whole.
    nearest = semantic_ranking(ask)
    with search_deadline(RECALL_SECONDS):
        recalled = _recall(ask, nearest=nearest)
    logger.info(
        "chat_context_recall source=auto session=%s hits=%d semantic=%d runes=%d",
        ask.session_id,
        len(recalled),
        len(nearest),
        len(recall_render(recalled)),
    )
    return recalled


def _recall(ask: RecallAsk, *, nearest: list[int]) -> list[Recalled]:
    gap = [m for m in ask.gap if m.role in _ROLES and m.content]
    scores, matched_by = _lexical(ask, gap=gap)
    if nearest:
        scores = defaultdict(float, rank_fuse(scores, nearest))
    if not scores:
        return []
    return _fit(ask, gap=gap, scores=scores, matched_by=matched_by)


def _lexical(ask: RecallAsk, *, gap: list[TailMessage]) -> tuple[dict[int, float], dict[int, str]]:
    """The lexical scores of the archive's and the gap's messages, and the term each matched
    by (a long message is cut around it)."""
    scores: dict[int, float] = defaultdict(float)
    matched_by: dict[int, str] = {}
    terms = _weighted_terms(ask)
    if not terms:
        return scores, matched_by
    scope = (
        Scope(owner_id=ask.owner_id, session_id=ask.session_id, below_id=ask.below_id)
        if ask.below_id is not None
        else None
    )
    phrase = " ".join(ask.query.split())
    if scope is not None and PHRASE_MIN_CHARS <= len(phrase) <= QUERY_MAX_CHARS:
        for mid in message_ids_search(scope=scope, query=phrase, limit=8).ids:
            scores[mid] += PHRASE_BONUS
            matched_by[mid] = phrase
    for mid in _gap_hits(gap, phrase.casefold()) if len(phrase) >= PHRASE_MIN_CHARS else []:
        scores[mid] += PHRASE_BONUS
        matched_by[mid] = phrase
    total = max(ask.messages, len(gap), 1)
    for term, weight in terms.items():
        ids = message_ids_search(scope=scope, query=term, limit=TERM_HITS).ids if scope else []
        ids += _gap_hits(gap, term)
        if not ids:
            continue
        idf = math.log(1 + total / len(ids)) * weight * (2.0 if term_is_identifier(term) else 1)
        for mid in ids:
            scores[mid] += idf
            matched_by.setdefault(mid, term)
    return scores, matched_by


def _neighbours(*, session_id: int, ids: list[int], gap_ids: list[int]) -> dict[int, list[int]]:
    """For each of `ids`, the ids of the messages just before and after it in the session: from
    the gap when it is there, else in one statement (two index lookups per id)."""
    out: dict[int, list[int]] = {}
    position = {mid: i for i, mid in enumerate(gap_ids)}
    asked = []
    for mid in ids:
        if mid in position:
            i = position[mid]
            out[mid] = [gap_ids[j] for j in (i - 1, i + 1) if 0 <= j < len(gap_ids)]
        else:
            asked.append(mid)
    if asked:
        table = connection.ops.quote_name(ChatMessage._meta.db_table)
        before = f"(SELECT MAX(id) FROM {table} WHERE session_id = %s AND id < %s)"  # noqa: S608
        after = f"(SELECT MIN(id) FROM {table} WHERE session_id = %s AND id > %s)"  # noqa: S608
        sql = "SELECT " + ", ".join(f"{before}, {after}" for _ in asked)
        params: list[int] = []
        for mid in asked:
            params += [session_id, mid, session_id, mid]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        for k, mid in enumerate(asked):
            out[mid] = [n for n in row[2 * k : 2 * k + 2] if n is not None]
    return out


def _fit(
    ask: RecallAsk, *, gap: list[TailMessage], scores: dict[int, float], matched_by: dict[int, str]
) -> list[Recalled]:
    ranked = sorted(scores, key=lambda mid: (-scores[mid], -mid))[:NEIGHBOURED_MAX]
    gap_ids = [m.id for m in gap]
    near = _neighbours(session_id=ask.session_id, ids=ranked, gap_ids=gap_ids)
    in_gap = set(gap_ids)
    candidates = {mid: scores[mid] for mid in ranked}
    for mid in ranked:
        for n in near.get(mid, []):
            if ask.below_id is not None and n >= ask.below_id and n not in in_gap:
                continue  # in the payload's core already
            candidates[n] = max(
                candidates.get(n, 0.0), scores.get(n, 0.0), scores[mid] * NEIGHBOUR_SHARE
            )
    rows = (
        ChatMessage.objects.filter(
            session_id=ask.session_id, id__in=list(candidates), role__in=_ROLES
        )
        .exclude(status__in=EXCLUDED_FROM_MODEL)
        .values_list("id", "role", "created_at", "content")
    )
    by_id = {row[0]: row for row in rows}
    chosen: dict[int, Recalled] = {}
    left = ask.room
    for mid in sorted(candidates, key=lambda m: (-candidates[m], -m)):
        if mid not in by_id or not by_id[mid][3]:
            continue
        _, role, created_at, content = by_id[mid]
        text = cut_around(content, around=matched_by.get(mid, ""), runes=EXCERPT_RUNES)
        piece = Recalled(id=mid, role=role, created_at=created_at, content=text)
        cost = recall_piece_runes(piece, first=not chosen)
        if cost > left:
            continue
        chosen[mid] = piece
        left -= cost
    return _runs(sorted(chosen.values(), key=lambda m: m.id), near=near, gap_ids=gap_ids)


def _runs(
    recalled: list[Recalled], *, near: dict[int, list[int]], gap_ids: list[int]
) -> list[Recalled]:
    """`recalled` with `follows` set where the message before it in the conversation is the one
    before it here: one dated header per run of adjacent messages (so the rendering can only
    shrink from what `_fit` charged)."""
    out: list[Recalled] = []
    for m in recalled:
        prev = out[-1].id if out else None
        adjacent = prev is not None and (prev in near.get(m.id, []) or m.id in near.get(prev, []))
        out.append(Recalled(m.id, m.role, m.created_at, m.content, follows=adjacent))
    return out
