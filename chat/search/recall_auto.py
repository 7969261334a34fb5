"""Automatic recall: the turns of a conversation that best match the user's new message, found
for the payload composer (chat/context/compose.py) before every model call, for every session.

Where from: the archive (messages older than the session's anchor, found through the search
index, chat/search/selectors.py) and the gap (verbatim-tail messages the composer did not keep
in the payload's core, already in memory: scored here without a query).

How "best" is found without embeddings (lexical, BM25-like):
- the terms of the new message (chat/search/terms.py), each by its English stem ("painting"
  finds "painted": the matching is by substring), and at half weight those of the turn before
  it, which only sharpen what the new message matches ("and when was that?");
- the archive's newest 1,000 rows (kept in this process between sends,
  chat/search/archive_window.py) and the gap are matched in memory; only the rarest terms are
  also looked up in the index below that window (at most three, in one statement), as a
  trigram lookup costs with the matches it reads;
- a term weighs BM25's idf (a term in most messages says next to nothing), identifiers twice;
  a long message's score is half length-normalised; the whole message found as a phrase wins;
- each of the best hits brings the two turns on either side at half its score: a question's
  answer (or the question an answer needs) rarely repeats the question's words; the turn
  after a hit that asks something (its answer, likely) at three quarters;
- the kind a question asks for ("what martial arts...", "which European countries...")
  matches the turns that name one of its members ("taekwondo", "Spain"), from WordNet
  (chat/search/concepts.py): in memory only, each member named one term at half its idf.
With an embedding model configured, the messages nearest the query's meaning
(chat/search/semantic.py) join the ranking by reciprocal-rank fusion: "what pets does she
have?" finds "we got another cat", which shares no word with it.
Replies the model is never sent (streaming, failed) and tool results (text fetched from outside,
the likeliest carrier of an injection) are never recalled. The index lookups run under the
recall deadline (the other reads are bounded by their keys); a slow or failing lookup adds
nothing, and a failing recall never fails a send (the composer sends without it).
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from chat.context.compose import (
    RECALL_OPENING_RUNES,
    RECALL_RUN_SAVING,
    SEPARATOR,
    RecallAsk,
    Recalled,
    recall_body_runes,
    recall_render_runes,
)
from chat.errors import SearchTimeout
from chat.models import EXCLUDED_FROM_MODEL, MessageRole
from chat.search.archive_window import (
    WINDOW_ROWS,
    ArchiveWindow,
    archive_window_read,
    older_hits_keep,
)
from chat.search.backends import (
    Scope,
    index_hits_many,
    indexable,
    rows_by_id,
    stamp_datetime,
)
from chat.search.concepts import KindTexts, concepts_named
from chat.search.recall import PHRASE_MIN_CHARS, RECALL_SECONDS, cut_around
from chat.search.recall_neighbours import neighbour_shares, neighbours_of
from chat.search.recall_order import RecallOrder, recall_runs
from chat.search.recall_warm import recall_window_read_later
from chat.search.selectors import search_deadline
from chat.search.semantic import rank_fuse, semantic_ranking
from chat.search.terms import recall_terms, term_is_identifier, term_stem

logger = logging.getLogger("chat.search")

TERMS_MAX = 8
CONTEXT_TERMS_MAX = 3
# The archive's newest rows, matched in memory against every term: WINDOW_ROWS
# (chat/search/archive_window.py), or, for a send that finds none kept in this process (the
# first after an import, a restart or an edit), the newest COLD_WINDOW_ROWS of them while the
# whole window is read off its way for the sends after it. Its rarer terms are looked up in
# the index below those rows, as below any window.
COLD_WINDOW_ROWS = 150
# A term in less of that window than this is rare: the index is asked for its older matches,
# for the rarest INDEX_TERMS_MAX such terms (on PostgreSQL a trigram lookup costs with the
# matches it sorts: rare terms only).
RARE_SHARE = 0.005
INDEX_TERMS_MAX = 3
# The same for a send's newest COLD_WINDOW_ROWS only (none kept): a term in at most one of
# them, up to six. The window stood for most of the archive's matches; without it they come
# from the index. On LoCoMo conversation 41 with every question sent cold, the questions with
# all their evidence sent went 77% -> 80% at 48,000 runes, 62% -> 68% at 16,000 (90% and 80%
# with the window kept). A term in one of 150 rows may be in ~1% of a long archive: on
# PostgreSQL each of its matches is read and sorted, so not higher.
COLD_RARE_SHARE = 0.01
COLD_INDEX_TERMS_MAX = 6
# The deadline of the lookup of those past the first INDEX_TERMS_MAX.
COLD_EXTRA_SECONDS = 0.05
# Matches asked of the index per rare term.
TERM_HITS = 40
# BM25's length normalisation, halfway: a long message matches more terms by chance.
LENGTH_NORM = 0.5
# Hits whose neighbours are looked up (one statement): the best ones, which the room can hold.
NEIGHBOURED_MAX = 120
PHRASE_BONUS = 100.0
# A concept's idf is halved: its members are a guess at what the message means, its words are
# what it says.
CONCEPT_WEIGHT = 0.5
# What one recalled message may take: a long one is cut around its match.
EXCERPT_RUNES = 1200
_ROLES = (MessageRole.USER, MessageRole.ASSISTANT)
# (id, score) pairs by score, then id.
_by_score = operator.itemgetter(1, 0)


def _weighted_terms(ask: RecallAsk) -> dict[str, float]:
    terms: dict[str, float] = {}
    for text, weight, most in ((ask.query, 1.0, TERMS_MAX), (ask.context, 0.5, CONTEXT_TERMS_MAX)):
        for term in recall_terms(text, most=most):
            # The stem finds the word too (the matching is by substring): one search, not two.
            terms.setdefault(term_stem(term).casefold(), weight)
    return terms


def recall_auto(ask: RecallAsk) -> list[Recalled]:
    """The best matches of `ask`, with their neighbours, fitted to `ask.room` once rendered, in
    conversation order. Logs `chat_context_recall source=auto`."""
    # Apart from the lexical search's deadline: its own failure leaves lexical recall whole.
    nearest = semantic_ranking(ask)
    recalled = _recall(ask, nearest=nearest)
    logger.info(
        "chat_context_recall source=auto session=%s hits=%d semantic=%d runes=%d",
        ask.session_id,
        len(recalled),
        len(nearest),
        recall_render_runes(recalled),
    )
    return recalled


def _recall(ask: RecallAsk, *, nearest: list[int]) -> list[Recalled]:
    terms = _weighted_terms(ask)
    if not terms and not nearest:
        return []
    gap = [m for m in ask.gap if m.role in _ROLES and m.content]
    # The archive's newest rows (kept between sends) and the gap, matched in memory.
    window = _window_of(ask)
    rows = window.rows if window is not None else []
    gap_texts = [(m.id, m.content.casefold()) for m in gap]
    phrase = " ".join(ask.query.split()).casefold()
    long_phrase = len(phrase) >= PHRASE_MIN_CHARS
    found = _matches(window, gap_texts, [*terms, *([phrase] if long_phrase else [])])
    length_of = (window.lengths if window is not None else {}) | {m: len(t) for m, t in gap_texts}
    average = sum(length_of.values()) / len(length_of) if length_of else 1.0
    searched = max(len(length_of), 1)
    total = max(ask.messages, searched)
    below_window = _below_window(ask, window)
    share = {term: len(found[term]) / searched for term in terms}
    # Only the newest rows were read (a window past its time is whole, and read again).
    cold = window is not None and window.partial
    rare_share = COLD_RARE_SHARE if cold else RARE_SHARE
    index_terms = COLD_INDEX_TERMS_MAX if cold else INDEX_TERMS_MAX
    rare = sorted(
        (t for t in terms if below_window is not None and share[t] < rare_share and indexable(t)),
        key=lambda t: (share[t], -len(t)),
    )[:index_terms]
    older: dict[str, list[int]] = {}
    if window and below_window:
        older = _older_hits(window, below_window, rare[:INDEX_TERMS_MAX])
        if rare[INDEX_TERMS_MAX:]:
            # A cold send's commoner terms: a statement of their own, under a short deadline,
            # so that one running long costs the rarest terms' matches nothing.
            older |= _older_hits(
                window, below_window, rare[INDEX_TERMS_MAX:], seconds=COLD_EXTRA_SECONDS
            )
    # The whole message found as a phrase names its matches first, and wins (below).
    matched = [_Matched(phrase, 0.0, found[phrase], asks=True)] if long_phrase else []
    for term, weight in terms.items():
        ids = found[term]
        if term in rare:
            ids = [*ids, *older.get(term, [])]
            df = max(len(ids), 1)
        else:
            df = max(int(share[term] * total), len(ids), 1)
        # BM25's idf: a term in most messages says next to nothing.
        idf = math.log(1 + (total - df + 0.5) / (df + 0.5))
        idf *= weight * (2.0 if term_is_identifier(term) else 1)
        matched.append(_Matched(term, idf, ids, asks=weight == 1.0))
    # The kinds the message asks for, spelled out ("martial arts": taekwondo...), by member.
    matched += _kinds_matched(ask, window, gap_texts, searched=searched, total=total)
    # The turn before only sharpens what the new message matches ("that bug" after a turn
    # naming it); alone it would recall what the payload holds already.
    asking = any(weight == 1.0 for weight in terms.values())
    scores, matched_by = _scored(matched, length_of=length_of, average=average, asked=asking)
    for mid in found[phrase] if long_phrase else ():
        scores[mid] += PHRASE_BONUS
    if nearest:
        scores = rank_fuse(scores, nearest)
    if not scores:
        return []
    sequence = [r.id for r in reversed(rows)] + [m.id for m in gap]
    return _fit(
        ask,
        sequence=sequence,
        scores=scores,
        matched_by=matched_by,
        window=window,
    )


def _kinds_matched(
    ask: RecallAsk,
    window: ArchiveWindow | None,
    gap: list[tuple[int, str]],
    *,
    searched: int,
    total: int,
) -> list[_Matched]:
    """The kinds `ask.query` asks for (chat/search/concepts.py): each member the window's rows
    and the gap's texts name, one term with its own idf, weighted down (a kind's members are a
    guess at what the message means). Matched in memory only (hundreds of words are no index
    lookup). By member, not one term for the whole kind: a message saying "yoga" is worth
    more than one saying "walk", as BM25 weighs any rarer word above a common one."""
    out: list[_Matched] = []
    concepts = concepts_named(ask.query)
    if not concepts:
        return out
    gap_kinds = KindTexts([text for _, text in gap])
    for concept in concepts:
        each: dict[str, list[int]] = {}
        for member, kept in (window.naming(concept) if window is not None else {}).items():
            each[member] = list(kept)
        for member, found in gap_kinds.naming(concept).items():
            each.setdefault(member, []).extend(gap[i][0] for i in found)
        for member, ids in sorted(each.items()):
            df = max(int(len(ids) / searched * total), len(ids), 1)
            idf = math.log(1 + (total - df + 0.5) / (df + 0.5)) * CONCEPT_WEIGHT
            out.append(_Matched(member, idf, ids, asks=True))
    return out


@dataclass(frozen=True, slots=True)
class _Matched:
    """A term (or the whole message as a phrase), its weighted idf, the messages holding it;
    `asks`: it is the new message's own (not the turn before's)."""

    term: str
    idf: float
    ids: Sequence[int]
    asks: bool


def _scored(
    matched: list[_Matched], *, length_of: dict[int, int], average: float, asked: bool
) -> tuple[dict[int, float], dict[int, str]]:
    """BM25 over `matched`: each message's idfs summed, the sum half length-normalised; and
    the first of `matched` to hold each message, which names it. `asked`: only the messages
    a term that asks holds. Summed in numpy: a long chat's common words match thousands of
    messages per send (~6,700 matches on bench ttft's 1M-message session), and the same sum
    in a Python loop took ~1.5 ms before the first token. (Summed before it is divided, a
    score may differ from the term-by-term sum in its last bits.)"""
    matched = [m for m in matched if m.ids]
    if not matched:
        return {}, {}
    counts = [len(m.ids) for m in matched]
    ids = np.fromiter(
        itertools.chain.from_iterable(m.ids for m in matched), dtype=np.int64, count=sum(counts)
    )
    which = np.repeat(np.arange(len(matched)), counts)
    unique, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    idf = np.array([m.idf for m in matched])
    summed = np.bincount(inverse, weights=idf[which], minlength=len(unique))
    messages = unique.tolist()
    lengths = np.array([length_of.get(mid, average) for mid in messages])
    # BM25's length normalisation, as (1 - b) + b * length / average.
    score = summed / ((1 - LENGTH_NORM) + LENGTH_NORM / average * lengths)
    # Every message matched keeps its name, those of the turn before too: a neighbour or a
    # semantic match among them is cut around it.
    names = dict(zip(messages, [matched[i].term for i in which[first].tolist()], strict=True))
    if asked:
        asks = np.array([m.asks for m in matched])
        keep = np.bincount(inverse, weights=asks[which], minlength=len(unique)) > 0
        messages, score = unique[keep].tolist(), score[keep]
    return dict(zip(messages, score.tolist(), strict=True)), names


def _window_of(ask: RecallAsk) -> ArchiveWindow | None:
    """The archive's newest WINDOW_ROWS rows, kept between sends (with none kept, the newest
    COLD_WINDOW_ROWS; either read again in the background then, or when the kept one is past
    its ENTRY_SECONDS); None with no archive."""
    if ask.below_id is None:
        return None
    window = archive_window_read(
        owner_id=ask.owner_id,
        session_id=ask.session_id,
        below_id=ask.below_id,
        size=WINDOW_ROWS,
        version=ask.version,
        cold_rows=COLD_WINDOW_ROWS,
    )
    if window.read_again:
        # It starts once this send has its first token (the warming thread gives way to it).
        recall_window_read_later(
            session_id=ask.session_id,
            owner_id=ask.owner_id,
            below_id=ask.below_id,
            version=ask.version,
            size=WINDOW_ROWS,
        )
    return window


def _below_window(ask: RecallAsk, window: ArchiveWindow | None) -> Scope | None:
    """Where the index is asked for a rare term's older matches: the archive below the window,
    when there is one. The window stands for the whole archive where it holds all of it, or
    where a term is common in it; a term rare in it is also looked up below it."""
    if window is None or not window.more:
        return None
    below_id = window.rows[-1].id if window.rows else window.below_id
    return Scope(
        owner_id=ask.owner_id, session_id=ask.session_id, below_id=below_id, recallable=True
    )


def _matches(
    window: ArchiveWindow | None, gap: list[tuple[int, str]], terms: list[str]
) -> dict[str, list[int]]:
    """For each term (case-folded), the ids of the window's rows and the gap's texts (already
    case-folded) that contain it."""
    return {
        term: [
            *(window.containing(term) if window is not None else []),
            *(mid for mid, text in gap if term in text),
        ]
        for term in terms
    }


def _older_hits(
    window: ArchiveWindow, scope: Scope, terms: list[str], *, seconds: float = RECALL_SECONDS
) -> dict[str, list[int]]:
    """The terms' newest matches below the window: kept from an earlier send's lookup (the
    rows below a bound never change), else looked up in one statement; none when that runs
    out of time (the window's matches still count)."""
    assert scope.below_id is not None  # below_window is always bounded
    # .get, not `in` then []: another thread may clear the kept lookups in between.
    kept = {
        t: ids for t in terms if (ids := window.older_hits.get((scope.below_id, t))) is not None
    }
    asked = [t for t in terms if t not in kept]
    if not asked:
        return kept
    try:
        # The only statements of recall that can run long (a term with many trigram matches):
        # under the recall deadline. The rest read rows by key ranges and ids, bounded; a
        # deadline around them cost PostgreSQL four round trips (a savepoint, the timeout set
        # and put back) on every send.
        with search_deadline(seconds):
            found = index_hits_many(scope=scope, queries=asked, limit=TERM_HITS)
    except SearchTimeout:
        logger.info("chat_context_recall_term_timeout session=%s", scope.session_id)
        return kept
    older_hits_keep(window, {(scope.below_id, t): ids for t, ids in found.items()})
    return kept | found


def _fit(
    ask: RecallAsk,
    *,
    sequence: list[int],
    scores: dict[int, float],
    matched_by: dict[int, str],
    window: ArchiveWindow | None,
) -> list[Recalled]:
    # Best first, the newest of equals first (a C key: thousands of scores on a long chat).
    ranked = [mid for mid, _ in sorted(scores.items(), key=_by_score, reverse=True)]
    ranked = ranked[:NEIGHBOURED_MAX]
    # Each id's place in the sequence, for the neighbours and the order of the pieces.
    position = {mid: i for i, mid in enumerate(sequence)}
    near = neighbours_of(
        session_id=ask.session_id, ids=ranked, sequence=sequence, position=position
    )

    # The payload's core starts after the gap (or at the tail when there is no gap): its
    # messages are sent verbatim, never recalled.
    core: float = math.inf if ask.below_id is None else ask.below_id
    if ask.gap:
        core = ask.gap[-1].id + 1
    # Each hit's neighbours outside the core, by distance. The window's rows and the gap's
    # (read with the tail, dates too) are at hand; older hits' (and their neighbours') are
    # read (one statement). Reading the gap again was a statement before every first token
    # of a long chat (~80 rows on bench ttft's 1M-message session).
    around = {mid: [(n, d) for n, d in near.get(mid, ()) if n < core] for mid in ranked}
    wanted = dict.fromkeys(ranked)
    for found in around.values():
        wanted.update(found)  # (id, distance) pairs: only the keys are wanted
    known = window.by_id if window is not None else {}
    by_id = {m: (m, r.role, r.stamp, r.content) for m in wanted if (r := known.get(m))}
    for m in ask.gap:
        if m.id in wanted and m.stamp is not None and m.role in _ROLES:
            by_id[m.id] = (m.id, m.role, m.stamp, m.content)
    unknown = [m for m in wanted if m not in by_id]
    if unknown:
        scope = Scope(owner_id=ask.owner_id, session_id=ask.session_id)
        by_id.update(
            (mid, (mid, role, created_at, content))
            for mid, role, status, created_at, content in rows_by_id(scope=scope, ids=unknown)
            if role in _ROLES and status not in EXCLUDED_FROM_MODEL
        )
    candidates = {mid: scores[mid] for mid in ranked}
    for n, share in neighbour_shares(around, scores=scores, by_id=by_id).items():
        candidates[n] = max(scores.get(n, 0.0), share)
    order = RecallOrder(sequence, near, position=position)
    chosen: dict[int, tuple[str, datetime | None, str, int]] = {}
    # Every piece is charged as if it opened a run (a dated header and the separator: every
    # row has its created_at); the first piece rendered has no separator before it.
    left = ask.room + len(SEPARATOR)
    for mid, _ in sorted(candidates.items(), key=_by_score, reverse=True):
        row = by_id.get(mid)
        if row is None or not row[3]:
            continue
        _, role, stamp, content = row
        if min(len(content), EXCERPT_RUNES) > left + 2 * RECALL_RUN_SAVING:
            # Its quote costs more than its text less two headers it could save: no need to
            # cut and price it (most candidates, once the room is nearly full).
            continue
        text = cut_around(content, around=matched_by.get(mid, ""), runes=EXCERPT_RUNES)
        # Charged what it adds to the rendering: within a run of recalled neighbours a piece
        # has no header, and the run's next piece loses its own. Charging every piece a header
        # left a tenth of the room unused once the hits' neighbours came along.
        body = recall_body_runes(role, text)
        cost = body + RECALL_OPENING_RUNES
        if order.before(mid) in chosen:
            cost -= RECALL_RUN_SAVING
        if order.after(mid) in chosen:
            cost -= RECALL_RUN_SAVING
        if cost > left:
            continue
        when = window.created_at(mid, stamp) if window is not None else stamp_datetime(stamp)
        chosen[mid] = (role, when, text, body)
        left -= cost
    return recall_runs(chosen, adjacent=order.adjacent)
