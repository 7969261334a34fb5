"""The payload composer's growing of the verbatim core (chat/context/compose.py `_grow_core`):
priced from running sums, it must take exactly the turns a plain re-rendering would."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from chat.context.compose import Recalled, _grow_core, _unfollow, recall_render
from chat.context.cut import turn_starts
from chat.context.state import TailMessage

WHEN = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)


def _turns_taken(
    tail: list[TailMessage], *, starts: list[int], start: int, recalled: list[Recalled]
) -> Iterator[tuple[int, int, list[Recalled]]]:
    """The definition: each gap turn taken in turn (newest first, with all after it), as (its
    start, what taking it needs in all, what stays of recall), recall rendered again each time."""
    grown = 0
    for i in reversed([s for s in starts if s < start]):
        grown += sum(m.runes for m in tail[i:start])
        taken = {m.id for m in tail[i:start]}
        recalled = _unfollow([m for m in recalled if m.id not in taken])
        yield i, grown + len(recall_render(recalled)), recalled
        start = i


def _reference(
    tail: list[TailMessage], *, starts: list[int], start: int, recalled: list[Recalled], room: int
) -> tuple[int, list[Recalled]]:
    """Turns taken for as long as they fit."""
    for i, needs, kept in _turns_taken(tail, starts=starts, start=start, recalled=recalled):
        if needs > room:
            break
        start, recalled = i, kept
    return start, recalled


@st.composite
def composed(draw: st.DrawFn) -> tuple[list[TailMessage], list[int], int, list[Recalled], int]:
    n = draw(st.integers(min_value=1, max_value=40))
    tail = []
    for i in range(n):
        role = draw(st.sampled_from(["user", "assistant", "tool"])) if i else "user"
        runes = draw(st.integers(min_value=0, max_value=400))
        tail.append(TailMessage(1000 + i, role, "t" * runes, None, "", runes))
    if tail[-1].role != "user":
        tail.append(TailMessage(1000 + n, "user", "q", None, "", 1))
    starts = turn_starts(tail)
    start = draw(st.sampled_from(starts))
    # Archive ids below the tail, the gap's, and now and then one in the core (recall never
    # picks those, but the composer must keep them as they are).
    archive = list(range(960, 1000)) if draw(st.booleans()) else []
    core = [m.id for m in tail[start:]] if draw(st.booleans()) else []
    ids = sorted(draw(st.sets(st.sampled_from([*archive, *(m.id for m in tail)]), max_size=30)))
    ids = [mid for mid in ids if mid in archive or mid < tail[start].id or mid in core]
    recalled: list[Recalled] = []
    for mid in ids:
        text = draw(st.text(alphabet="ab\n", max_size=60))
        when = draw(st.sampled_from([WHEN, None]))
        follows = bool(recalled) and recalled[-1].id == mid - 1
        recalled.append(
            Recalled(mid, draw(st.sampled_from(["user", "assistant"])), when, text, follows)
        )
    # The room exactly at, just under or just over what taking some turn needs: where a
    # miscount shows.
    costs = [
        needs for _, needs, _ in _turns_taken(tail, starts=starts, start=start, recalled=recalled)
    ]
    room = draw(st.integers(min_value=0, max_value=8000))
    at_a_cost: bool = draw(st.booleans())
    if costs and at_a_cost:
        room = max(draw(st.sampled_from(costs)) + draw(st.sampled_from([-1, 0, 1])), 0)
    return tail, starts, start, recalled, room


@settings(max_examples=500, deadline=None)
@given(case=composed())
def test_grown_core_matches_rendering_again_for_every_turn(case):
    tail, starts, start, recalled, room = case
    assert _grow_core(tail, starts=starts, start=start, recalled=recalled, room=room) == (
        _reference(tail, starts=starts, start=start, recalled=recalled, room=room)
    )


def test_a_turn_recall_had_picked_moves_to_the_core_and_frees_its_quote():
    tail = [
        TailMessage(1000, "user", "u" * 50, None, "", 50),
        TailMessage(1001, "assistant", "a" * 50, None, "", 50),
        TailMessage(1002, "user", "q", None, "", 1),
    ]
    recalled = [
        Recalled(10, "user", WHEN, "old fact"),
        Recalled(1001, "assistant", WHEN, "a" * 50),
    ]
    starts = turn_starts(tail)
    quoted = len(recall_render(recalled))
    # Room for the whole turn once its own quote is freed, not for both.
    room = 100 + len(recall_render(recalled[:1]))
    assert room < 100 + quoted
    start, kept = _grow_core(tail, starts=starts, start=2, recalled=recalled, room=room)
    assert (start, [m.id for m in kept]) == (0, [10])
