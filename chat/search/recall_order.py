"""The order of recalled messages (chat/search/recall_auto.py): which follows which in the
conversation, as far as recall knows, and runs of adjacent ones rendered under one header."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime

from chat.context.compose import Recalled


def recall_runs(
    chosen: dict[int, tuple[str, datetime | None, str, int]],
    *,
    adjacent: Callable[[int, int], bool],
) -> list[Recalled]:
    """The pieces recall_auto's `_fit` chose (id: role, date, text, counted body) in
    conversation order, `follows` set where the piece before it here is the message just
    before it in the conversation: one dated header per run of adjacent messages (so the
    rendering can only shrink from what `_fit` charged). Made once each, here: a frozen
    dataclass costs ~1 us to make, and a send of a long chat recalls ~270 pieces."""
    out: list[Recalled] = []
    previous: int | None = None
    for mid in sorted(chosen):
        role, when, text, body = chosen[mid]
        follows = previous is not None and adjacent(previous, mid)
        out.append(Recalled(mid, role, when, text, follows=follows, body_runes=body))
        previous = mid
    return out


class RecallOrder:
    """Which message follows which in the conversation, as far as recall knows: the window and
    the gap's sequence (contiguous, in order), and each looked-up hit's run of neighbours."""

    def __init__(
        self,
        sequence: list[int],
        near: dict[int, list[tuple[int, int]]],
        *,
        position: dict[int, int],
    ) -> None:
        self._sequence = sequence
        self._position = position  # each id's place in `sequence`
        self._after: dict[int, int] = {}
        self._before: dict[int, int] = {}
        for hit, found in near.items():
            if hit not in self._position:
                for a, b in itertools.pairwise(sorted([hit, *(n for n, _ in found)])):
                    self._after[a], self._before[b] = b, a

    def adjacent(self, before: int, after: int) -> bool:
        i, j = self._position.get(before), self._position.get(after)
        if i is not None and j is not None:
            return j == i + 1
        return self._after.get(before) == after

    def before(self, mid: int) -> int | None:
        i = self._position.get(mid)
        if i is None:
            return self._before.get(mid)
        return self._sequence[i - 1] if i else self._before.get(mid)

    def after(self, mid: int) -> int | None:
        i = self._position.get(mid)
        if i is None or i + 1 == len(self._sequence):
            return self._after.get(mid)
        return self._sequence[i + 1]
