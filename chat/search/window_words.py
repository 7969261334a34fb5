"""The words of a kept archive window (chat/search/archive_window.py) and the rows holding each:
a term is found in the window's distinct words, not by testing each of its rows.

Recall asks a window for the rows holding each word of a new message. Testing every row costs
~0.1-0.3 ms a word for 1,000 rows (3.2 ms for the eleven words of bench ttft's probe on its
imported session's long rows); asked of the window's words (593 distinct there, a few thousand
in a chat of varied prose), 0.13 ms for all eleven. Building the list costs 10-30 ms for
1,000 rows: never on a send's way, nor where a send is likely to come at once. It is built on
the warming thread (chat/workers.py `warm_submit`) when a chat is opened
(chat/search/recall_warm.py), with its window. Built after a send that had to read its window
(tried), it overlapped the next send: bench ttft's second send to its imported session, which
follows the first at once, took 26-36 ms against 15-28 without it (the build held the GIL as
the request came in). Without a list, and for a phrase (a term with white space), the rows are
tested one by one.

Why the word list answers the same as the rows: a term without white space that occurs in a
text lies within one of its white-space-separated words, so the rows holding it are the rows
of the words holding it. The list is joined into one string, each word on its own line, and a
term is found in it with str.find (C), each occurrence mapped back to its word.

Built once for a window's rows and never changed (a thread may be reading it): when the
window's bound moves, the rows it gained are kept beside it and tested as before (a few per
send), and rows fallen off the window's end are left out by id. Past EXTRA_ROWS_MAX gained rows
it is dropped, and built again when the chat is next opened. A term found in more than
WORDS_PER_TERM_MAX words is answered by testing the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from chat.workers import background_yield

# Rows gained since the build, tested one by one; past this the list is dropped (built again
# when the chat is next opened).
EXTRA_ROWS_MAX = 200
# Words holding one term that the list maps back to their rows, at most: past it the caller
# tests the rows instead. Each costs a few Python steps; a term in 80,000 distinct words ("abc"
# in "abc0 abc1 ...", a chat of generated text) took 43 ms that way against 0.13 ms by rows.
WORDS_PER_TERM_MAX = 256
# What a list costs in memory, counted against the archive cache's bound in characters of its
# words: its index's keys, the ids' tuples and the joined copy come to ~20 bytes a character,
# and the cache counts ~3.6 bytes for each character it holds.
RUNES_PER_CHAR = 6
# Rows read between two background_yield() calls while building (~0.1-0.2 ms of them).
_BUILD_STEP_ROWS = 10


class _Row(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def folded(self) -> str: ...


@dataclass(frozen=True, slots=True)
class WindowWords:
    """Each distinct word of a window's rows (case-folded, split at white space) and the ids of
    the rows holding it, newest first; `extra`: rows gained since (id, folded), newest first."""

    index: dict[str, tuple[int, ...]]
    blob: str  # the words, each between two newlines
    extra: tuple[tuple[int, str], ...] = ()

    def find(self, term: str, *, oldest: int) -> tuple[int, ...] | None:
        """The ids (newest first, none under `oldest`) of the rows holding `term`; None for a
        term this list does not answer (empty, with white space, or in too many words)."""
        if not term or any(c.isspace() for c in term):
            return None
        blob, index = self.blob, self.index
        found: set[int] = set()
        words = 0
        start = blob.find(term)
        while start >= 0:
            words += 1
            if words > WORDS_PER_TERM_MAX:
                return None
            begin = blob.rfind("\n", 0, start) + 1
            end = blob.find("\n", start)
            found.update(index[blob[begin:end]])
            start = blob.find(term, end)
        older = sorted((mid for mid in found if mid >= oldest), reverse=True)
        # Gained rows may have fallen off the end too (a window of long messages keeps fewer).
        return (*(mid for mid, folded in self.extra if mid >= oldest and term in folded), *older)

    @property
    def runes(self) -> int:
        """What the list counts against the archive cache's bound."""
        return RUNES_PER_CHAR * len(self.blob)

    def gained(self, rows: Sequence[_Row]) -> WindowWords | None:
        """The same list for a window that gained `rows` (newest first, all newer than the
        list's); None past EXTRA_ROWS_MAX of them."""
        extra = (*((r.id, r.folded) for r in rows), *self.extra)
        if len(extra) > EXTRA_ROWS_MAX:
            return None
        return WindowWords(self.index, self.blob, extra)


def window_words_build(*, rows: Sequence[_Row]) -> WindowWords:
    """The word list of `rows` (newest first). Background work: it gives way to sends."""
    index: dict[str, list[int]] = {}
    for start in range(0, len(rows), _BUILD_STEP_ROWS):
        background_yield()
        for row in rows[start : start + _BUILD_STEP_ROWS]:
            mid = row.id
            for word in set(row.folded.split()):
                held = index.get(word)
                if held is None:
                    index[word] = [mid]
                else:
                    held.append(mid)
    return WindowWords(
        {word: tuple(ids) for word, ids in index.items()}, "\n" + "\n".join(index) + "\n"
    )
