"""The neighbours of automatic recall's hits (chat/search/recall_auto.py): the turns around
each hit in the conversation, and what of the hit's score each takes. A question's answer (or
the question an answer needs) rarely repeats the question's words: it comes in as a neighbour
of the turn that does."""

from __future__ import annotations

from django.db import connection

from chat.models import ChatMessage

# Neighbours up to this far, each at this share of its hit's score by distance.
NEIGHBOURS = 2
NEIGHBOUR_SHARES = (0.5, 0.5)
# The share of the message after a hit that asks a question (its answer, likely).
ANSWER_SHARE = 0.75
# How far in id a neighbour looked up in the database may be (other sessions write between).
NEIGHBOUR_SPAN = 16
# Ranges looked up per statement (_looked_up): under SQLite's limits of 500 arms in
# a compound statement and (before 3.32) 999 parameters, 3 per arm.
_ARMS_MAX = 200


def neighbours_of(
    *, session_id: int, ids: list[int], sequence: list[int], position: dict[int, int]
) -> dict[int, list[tuple[int, int]]]:
    """For each of `ids`, the messages up to NEIGHBOURS before and after it in the session, as
    (id, distance): from `sequence` (the window and the gap, contiguous, in conversation order)
    when it is there, else in one statement (index lookups on the session's id index)."""
    out: dict[int, list[tuple[int, int]]] = {}
    asked = []
    for mid in ids:
        if mid in position:
            i = position[mid]
            out[mid] = [
                (sequence[i + d], abs(d))
                for d in range(-NEIGHBOURS, NEIGHBOURS + 1)
                if d and 0 <= i + d < len(sequence)
            ]
        else:
            asked.append(mid)
    if asked:
        _looked_up(session_id=session_id, ids=asked, out=out)
    return out


def _looked_up(*, session_id: int, ids: list[int], out: dict[int, list[tuple[int, int]]]) -> None:
    """The neighbours of archive hits older than the window, in one statement (recall_auto's
    NEIGHBOURED_MAX hits need no more): the session's ids within NEIGHBOUR_SPAN of each hit
    (ranges on the session's id index; a correlated lookup per neighbour cost PostgreSQL
    0.25-0.5 s to plan for 120 hits). A session's consecutive messages are near each other in
    id unless many other sessions wrote between them: a neighbour that far is left out.

    One arm per range (UNION ALL), each a range of the session's index, not `session_id = %s
    AND (id BETWEEN .. OR ..)`. Given that OR with bound parameters, SQLite walked the session's
    whole index (137 ms for 100 ranges in a 1M-message session, 430 ms for 120; the arms: 0.9
    ms), and PostgreSQL planned it for 8 ms and ran a parallel bitmap scan (ttft bench's data,
    client-side medians: 40 ranges 13.6 -> 5.1 ms, 120 ranges 39.5 -> 11.7 ms)."""
    ranges: list[tuple[int, int]] = []
    for mid in sorted(ids):
        low, high = mid - NEIGHBOUR_SPAN, mid + NEIGHBOUR_SPAN
        if ranges and low <= ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], high)
        else:
            ranges.append((low, high))
    table = connection.ops.quote_name(ChatMessage._meta.db_table)
    arm = f"SELECT id FROM {table} WHERE session_id = %s AND id BETWEEN %s AND %s"  # noqa: S608
    near: list[int] = []
    # More than one statement only past _ARMS_MAX ranges (SQLite's limits).
    for start in range(0, len(ranges), _ARMS_MAX):
        chunk = ranges[start : start + _ARMS_MAX]
        with connection.cursor() as cursor:
            cursor.execute(
                " UNION ALL ".join([arm] * len(chunk)),
                [bound for low, high in chunk for bound in (session_id, low, high)],
            )
            near.extend(row[0] for row in cursor.fetchall())
    # The ranges are disjoint and ascending; the arms' order is not SQL's promise: sorted here.
    near.sort()
    position = {mid: i for i, mid in enumerate(near)}
    for mid in ids:
        i = position.get(mid)
        if i is None:
            continue
        out[mid] = [
            (near[i + d], abs(d))
            for d in range(-NEIGHBOURS, NEIGHBOURS + 1)
            if d and 0 <= i + d < len(near) and abs(near[i + d] - mid) <= NEIGHBOUR_SPAN
        ]


def neighbour_shares(
    around: dict[int, list[tuple[int, int]]],
    *,
    scores: dict[int, float],
    by_id: dict[int, tuple[int, str, object, str]],
) -> dict[int, float]:
    """What each hit's neighbours (`around`: by distance, none in the core) take of its score:
    NEIGHBOUR_SHARES by distance, ANSWER_SHARE for a question's answer; a neighbour of several
    hits keeps its best share (their sum, tried on LoCoMo, won questions at 16,000 runes and
    lost some at 48,000: docs/benchmarks.md)."""
    shared: dict[int, float] = {}
    best = shared.get
    for mid, found in around.items():
        score = scores[mid]
        row = by_id.get(mid)
        # A hit that asks something passes more of its score to its answer, which seldom
        # repeats the question's words ("what do you do for fun?" -> "writing and hanging out
        # with friends"): the first message after it that recall may quote (below the window
        # a tool row or a failed reply may come between).
        answer = None
        if row is not None and _asks(row[3]):
            answer = min(
                (n for n, _ in found if n > mid and n in by_id and by_id[n][3]), default=None
            )
        for n, distance in found:
            share = (ANSWER_SHARE if n == answer else NEIGHBOUR_SHARES[distance - 1]) * score
            if share > best(n, -1.0):  # every neighbour is a candidate
                shared[n] = share
    return shared


def _asks(text: str) -> bool:
    """Whether `text` asks something: a "?", or a full-width (Chinese, Japanese) or Arabic
    question mark. By `in`, each: a hit's text may be a pasted page, and a character beyond an
    ASCII text's range is not looked for at all (a regular expression's class scanned the ~120
    hits' texts for 0.3 ms before every first token of a long chat)."""
    return "?" in text or "\uff1f" in text or "\u061f" in text
