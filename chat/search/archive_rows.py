"""What a kept recall window holds (chat/search/archive_window.py keeps them): its rows, the
matches asked of it, and how those move with the window's bound (the rows a moved bound gained
scanned, the ones fallen off its end dropped)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from chat.search.backends import stamp_datetime
from chat.search.concepts import KindTexts
from chat.search.window_words import WindowWords

# Index lookups kept per window (term and bound), each up to recall's TERM_HITS ids.
OLDER_TERMS_MAX = 256
# Words whose matching rows are kept per window (each up to the window's rows' ids), and the
# longest kept.
MATCHED_TERMS_MAX = 64
MATCHED_TERM_RUNES = 64
# Kinds (chat/search/concepts.py) whose members' rows are kept per window.
NAMED_KINDS_MAX = 32


class ArchiveRow(NamedTuple):
    """A message of a window. A named tuple, not a frozen dataclass: a window's first read
    makes 1,000 of them before the first token (with the case-folding, 0.93 -> 0.80 ms)."""

    id: int
    role: str
    stamp: Any  # created_at as the database gave it: ArchiveWindow.created_at reads it
    content: str
    folded: str  # content.casefold(): recall matches terms against it


@dataclass(frozen=True, slots=True)
class ArchiveWindow:
    """Up to `size` recallable messages (user and assistant, sent to the model, not empty) of
    a session with ids under `below_id`, newest first. `more`: older messages lie below the
    oldest row (the window does not hold the whole archive)."""

    below_id: int
    version: int  # the session's messages_version it was read at
    rows: list[ArchiveRow]
    more: bool
    size: int
    read_at: float
    runes: int  # what it holds, content and folded copy: its share of CACHE_RUNES_MAX
    # Index lookups below the window, by (the id they were below, term): recall's rare terms
    # (chat/search/recall_auto.py). The rows under a bound never change (archive_window.py), and a
    # rare word of a question tends to come back in the next ones; bounded by OLDER_TERMS_MAX.
    older_hits: dict[tuple[int, str], list[int]]
    # Derived once per window for recall's ranking: each row by id, its folded length.
    by_id: dict[int, ArchiveRow]
    lengths: dict[int, int]
    # The rows holding each word asked of this window (bounded by MATCHED_TERMS_MAX): a chat's
    # messages come back to its words, and the rows of a window never change.
    matched: dict[str, tuple[int, ...]]
    # The same for the kinds asked of it (bounded by NAMED_KINDS_MAX): each member's rows.
    named: dict[str, dict[str, tuple[int, ...]]]
    # The created_at of the rows recall quoted, read from their stamps: only those are dated
    # (1,000 read with the rows were ~0.6 ms of every first send; ~300 read every send were
    # 0.4 ms of each send to a long chat), each once.
    dates: dict[int, datetime]
    # The rows' folded texts, for the kinds a question asks for: their words are read on the
    # first. Not counted in `runes`: their distinct ASCII words (~250 KB for 1,000 LoCoMo
    # turns, 126k characters; a set holds each word in ~100 bytes), kept until the window is
    # read anew (ENTRY_SECONDS at most).
    kinds: KindTexts
    # The rows' distinct words, once built on the warming thread (chat/search/window_words.py):
    # a word not asked before is found in them instead of in each row.
    word_rows: WindowWords | None = None
    # A list was built for these rows and did not fit: opening the chat again would only build
    # it again to throw it away.
    words_tried: bool = False
    # A stand-in for one send, given only with archive_window_read's `cold_rows`: the newest
    # of the rows asked for (`partial`: none were kept; not kept itself), or a kept window past
    # ENTRY_SECONDS. The caller has the whole window read again off the send's way.
    read_again: bool = False
    partial: bool = False

    def created_at(self, mid: int, stamp: Any) -> datetime:
        """When message `mid` was written, from its `stamp` (as the database gave it, or a
        datetime); kept for the window's own rows."""
        found = self.dates.get(mid)
        if found is None:
            found = stamp_datetime(stamp)
            if mid in self.by_id:
                self.dates[mid] = found
        return found

    def containing(self, term: str) -> tuple[int, ...]:
        """The ids of the rows that contain `term` (case-folded), newest first."""
        # .get, not `in` then []: another thread may clear the kept terms in between.
        found = self.matched.get(term)
        if found is None:
            # The word list when it is built; else a scan of every row (~0.1-0.3 ms a term for
            # 1,000 messages). The list takes 10-30 ms to build: never before a first token.
            listed = (
                self.word_rows.find(term, oldest=self.rows[-1].id)
                if self.word_rows is not None and self.rows
                else None
            )
            found = (
                listed if listed is not None else tuple(r.id for r in self.rows if term in r.folded)
            )
            # Words only: a phrase (the whole new message) is seldom asked again, and may be
            # long.
            if len(term) <= MATCHED_TERM_RUNES and not any(c.isspace() for c in term):
                _kept_update(self.matched, {term: found}, most=MATCHED_TERMS_MAX)
        return found

    def naming(self, concept: str) -> dict[str, tuple[int, ...]]:
        """For each member of `concept` (chat/search/concepts.py) the rows name, their ids,
        newest first. Kept, as the words are."""
        found = self.named.get(concept)
        if found is None:
            found = {
                member: tuple(self.rows[i].id for i in at)
                for member, at in self.kinds.naming(concept).items()
            }
            _kept_update(self.named, {concept: found}, most=NAMED_KINDS_MAX)
        return found


def _kept_update(kept: dict[Any, Any], found: dict[Any, Any], *, most: int) -> None:
    """`found` into `kept`, which holds at most `most` entries: emptied first when they would
    not fit (a plain dict, no lock: a lost race between threads only costs a lookup again)."""
    if len(kept) + len(found) > most:
        kept.clear()
    kept.update(found)


def older_hits_keep(window: ArchiveWindow, found: dict[tuple[int, str], list[int]]) -> None:
    """Keep index lookups below `window`."""
    _kept_update(window.older_hits, found, most=OLDER_TERMS_MAX)


def matched_moved(
    kept: ArchiveWindow, *, added: list[ArchiveRow], rows: list[ArchiveRow]
) -> dict[str, tuple[int, ...]]:
    """The words `kept` matched, for the window its bound moved to (`rows`, newest first: the
    `added` rows on top of kept's, its oldest fallen off the end): the added rows scanned for
    each word, and the matches under the new oldest row dropped. A session whose bound moves
    every send (no summary yet, or an import's first compaction) otherwise scanned all of its
    rows again for every word of every send (~1.5 ms for eleven words and 1,000 rows)."""
    if not rows:
        return {}
    oldest = rows[-1].id
    return {
        term: tuple(r.id for r in added if r.id >= oldest and term in r.folded)
        + _still_in(ids, oldest)
        for term, ids in list(kept.matched.items())
    }


def named_moved(
    kept: ArchiveWindow, *, added: list[ArchiveRow], texts: KindTexts, rows: list[ArchiveRow]
) -> dict[str, dict[str, tuple[int, ...]]]:
    """The kinds' members `kept` found, for the window its bound moved to, as matched_moved
    (`texts`: the `added` rows' folded texts)."""
    if not rows:
        return {}
    oldest = rows[-1].id
    ids = [r.id for r in added]
    moved: dict[str, dict[str, tuple[int, ...]]] = {}
    for concept, members in list(kept.named.items()):
        new = texts.naming(concept)
        moved[concept] = {
            member: found
            for member in sorted({*members, *new})
            if (
                found := tuple(ids[i] for i in new.get(member, ()) if ids[i] >= oldest)
                + _still_in(members.get(member, ()), oldest)
            )
        }
    return moved


def _still_in(ids: tuple[int, ...], oldest: int) -> tuple[int, ...]:
    """`ids` (newest first) down to `oldest`: those fallen off the window's end dropped."""
    end = len(ids)
    while end and ids[end - 1] < oldest:
        end -= 1
    return ids[:end]


def words_moved(kept: ArchiveWindow, *, added: KindTexts) -> set[str] | None:
    """The words of `kept`'s rows (if a kind was asked of them) and the `added` rows'."""
    words = kept.kinds.words_read()
    if words is not None:
        # In place, not a copy (~0.2 ms for 10k words every send): `kept` is being replaced,
        # and a thread still reading it only finds more words, each looked for and not found.
        words.update(added.words)
    return words
