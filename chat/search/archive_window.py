"""The archive's newest rows for automatic recall (chat/search/recall_auto.py), kept in this
process between sends.

Every send of a long chat matches its new message against the newest WINDOW_ROWS messages
older than the payload's tail. Reading and case-folding them again each time was a third of
what recall added before the first token (2 of ~6 ms for 1,000 rows on SQLite, more on
PostgreSQL), and those rows hardly change from one send to the next. A kept window is used
only while the session's `messages_version` is the one it was read at: every change to
messages already stored moves it (a truncation, a message edited or deleted in the admin,
chat/services/sessions.py). A compaction does not: it moves the summary and the anchor, not a
message, and the tail's start moving forward is the bound moving forward (below). Keyed on the
context_version, which every compaction moves, a window was read again after each one: before
the first token of the next send (a payload build of 9-14 ms against ~4 with it kept), and
of every send while an import's first compaction committed chunk after chunk. Within one
version:

- the rows under a bound do not change: replies are written only while they stream (in the
  tail), and a regenerate rewrites only the session's last reply (in the tail, never under the
  bound);
- the bound moves forward as the tail does (a chat read in pages moves its tail every send):
  only the rows between the old and the new bound are read, and the oldest fall off the
  window's end; a bound that moved back is read anew;
- replies still streaming or failed are left out, as decided when a row is read. An entry is
  read again from scratch after ENTRY_SECONDS in any case;
- a truncation moves the version but deletes only messages at or above its cut: a window
  bound under the cut is kept at the new version (archive_window_truncated).

A send that finds no window kept (the first after an import, a restart, an edit) does not read
one before its first token: it recalls from the newest rows only, and the whole window is read
in the background for the sends after it (`cold_rows`).

A window read when its chat is opened (chat/search/recall_warm.py) also gets a list of its
words (chat/search/window_words.py), counted in its share of the bound.

Per process (several processes each keep their own, each checking the version it is given),
bounded (CACHE_RUNES_MAX, least recently used first out; a window of long messages holds
fewer rows, ROWS_RUNES_MAX), keyed by the owner and the session
(a session id from another owner finds nothing). Everything here is for a caller that already
checked the session's owner.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from time import monotonic
from typing import Any, NamedTuple

from chat.models import EXCLUDED_FROM_MODEL, MessageRole
from chat.search.backends import RawMessageRow, Scope, stamp_datetime, window_rows
from chat.search.concepts import KindTexts
from chat.search.window_words import WindowWords, window_words_build
from chat.workers import background_yield

# The rows of a window (automatic recall's, chat/search/recall_auto.py).
WINDOW_ROWS = 1000
# Kept text, in characters, over every session (the content and its folded copy both count).
# With what is around it (the rows, the kept matches and lookups): 3.6 bytes a counted
# character for 1,000 short ASCII messages (bench ttft's data), ~30 MB per process; Python
# keeps other scripts in 2 or 4 bytes a character: up to about twice that.
CACHE_RUNES_MAX = 8_000_000
# One window holding more than this is not kept: it would push out every other session.
ENTRY_RUNES_MAX = CACHE_RUNES_MAX // 8
# What a window's rows may hold (content and folded copy): a window of long messages keeps its
# newest rows within it, and recall asks the index below them, as below any window. Without it
# a chat of 1-3k-character replies (1,000 rows over ENTRY_RUNES_MAX) was never kept, and every
# send read its 1,000 rows again. The rows come first: a window whose word list
# (chat/search/window_words.py) does not fit beside them is kept without one.
ROWS_RUNES_MAX = ENTRY_RUNES_MAX
# Messages do not change (see above): this only bounds how long a kept entry is trusted (a
# reply left out as streaming when it was read). Past it, a send still recalls from it while
# it is read again in the background (archive_window_read's `cold_rows`).
ENTRY_SECONDS = 900.0
# Index lookups kept per window (term and bound), each up to recall's TERM_HITS ids.
OLDER_TERMS_MAX = 256
# Words whose matching rows are kept per window (each up to the window's rows' ids), and the
# longest kept.
MATCHED_TERMS_MAX = 64
MATCHED_TERM_RUNES = 64
# Kinds (chat/search/concepts.py) whose members' rows are kept per window.
NAMED_KINDS_MAX = 32
# A bound moved by more rows than this is read as a new window (one statement either way).
_DELTA_ROWS_MAX = 200
# Rows read per statement by a background read (archive_window_read's `in_steps`).
STEP_ROWS = 100
_RECALLED_ROLES = frozenset((MessageRole.USER, MessageRole.ASSISTANT))


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
    # (chat/search/recall_auto.py). The rows under a bound never change (see above), and a
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
    # of the rows asked for (none were kept; not kept itself), or a kept window past
    # ENTRY_SECONDS. The caller has the whole window read again off the send's way.
    read_again: bool = False

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


def _window(
    *,
    below_id: int,
    version: int,
    rows: list[ArchiveRow],
    more: bool,
    size: int,
    read_at: float,
    older_hits: dict[tuple[int, str], list[int]] | None = None,
    matched: dict[str, tuple[int, ...]] | None = None,
    named: dict[str, dict[str, tuple[int, ...]]] | None = None,
    dates: dict[int, datetime] | None = None,
    words: set[str] | None = None,
    word_rows: WindowWords | None = None,
    words_tried: bool = False,
) -> ArchiveWindow:
    runes = sum(len(r.content) + len(r.folded) for r in rows)
    if word_rows is not None:
        word_rows, words_tried, runes = _list_beside(runes, word_rows)
    by_id = {r.id: r for r in rows}
    lengths = {r.id: len(r.folded) for r in rows}
    return ArchiveWindow(
        below_id,
        version,
        rows,
        more,
        size,
        read_at,
        runes,
        older_hits or {},
        by_id,
        lengths,
        matched or {},
        named or {},
        dates or {},
        KindTexts([r.folded for r in rows], words=words),
        word_rows,
        words_tried,
    )


def _matched_moved(
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


def _named_moved(
    kept: ArchiveWindow, *, added: list[ArchiveRow], texts: KindTexts, rows: list[ArchiveRow]
) -> dict[str, dict[str, tuple[int, ...]]]:
    """The kinds' members `kept` found, for the window its bound moved to, as _matched_moved
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


def _words_moved(kept: ArchiveWindow, *, added: KindTexts) -> set[str] | None:
    """The words of `kept`'s rows (if a kind was asked of them) and the `added` rows'."""
    words = kept.kinds.words_read()
    if words is not None:
        # In place, not a copy (~0.2 ms for 10k words every send): `kept` is being replaced,
        # and a thread still reading it only finds more words, each looked for and not found.
        words.update(added.words)
    return words


_lock = threading.Lock()
_windows: OrderedDict[tuple[int, int], ArchiveWindow] = OrderedDict()
_kept_runes = 0


def archive_window_read(
    *,
    owner_id: int,
    session_id: int,
    below_id: int,
    size: int,
    version: int,
    cold_rows: int = 0,
    in_steps: bool = False,
) -> ArchiveWindow:
    """The newest `size` recallable messages of the session under `below_id`: from this
    process's cache where it holds them (reading only what the bound moved past), else from
    the database.

    `cold_rows` (a send before its first token): with no window kept, only that many are read;
    a kept window past ENTRY_SECONDS is used as it is. Either comes back `read_again`, and the
    caller has the whole window read off the send's way (chat/search/recall_warm.py). A first
    send to a session just imported read and case-folded 1,000 rows and tested each word of
    its message on each: ~12 of the 20 ms its recall took in process (bench ttft's imported
    session), against 1-2 ms for 150 rows.

    `in_steps` (background work): a whole window is read STEP_ROWS rows a statement, giving
    way to sends between them (background_yield)."""
    key = (owner_id, session_id)
    scope = Scope(owner_id=owner_id, session_id=session_id, below_id=below_id)
    with _lock:
        kept = _windows.get(key)
    stale = kept is not None and monotonic() - kept.read_at >= ENTRY_SECONDS
    if (
        kept is not None
        and kept.size == size
        and kept.version == version
        and kept.below_id <= below_id
        and (not stale or cold_rows)
    ):
        if kept.below_id == below_id:
            with _lock:
                if key in _windows:
                    _windows.move_to_end(key)
            return _stand_in(kept) if stale else kept
        found = window_rows(scope=scope, rows=_DELTA_ROWS_MAX, from_id=kept.below_id)
        if len(found) < _DELTA_ROWS_MAX:
            added = _recallable(found)
            added_texts = KindTexts([r.folded for r in added])
            rows = [*added, *kept.rows]
            within, cut = _within(rows[:size])
            window = _window(
                below_id=below_id,
                version=version,
                rows=within,
                more=kept.more or len(rows) > size or cut,
                size=size,
                read_at=kept.read_at,
                # A copy: the entries of a bound this window no longer has are never asked for.
                older_hits=dict(kept.older_hits),
                matched=_matched_moved(kept, added=added, rows=within),
                named=_named_moved(kept, added=added, texts=added_texts, rows=within),
                dates={m: d for m, d in kept.dates.items() if within and m >= within[-1].id},
                # A superset of the words once rows fall off: a kind's member found among them
                # is looked for in the rows, and found or not.
                words=_words_moved(kept, added=added_texts),
                word_rows=kept.word_rows.gained(added) if kept.word_rows is not None else None,
                words_tried=kept.words_tried,
            )
            _keep(key, window)
            return _stand_in(window) if stale else window
    read = cold_rows if 0 < cold_rows < size else size
    found = _rows_in_steps(scope, rows=read) if in_steps else window_rows(scope=scope, rows=read)
    rows, cut = _within(_recallable(found))
    window = _window(
        below_id=below_id,
        version=version,
        rows=rows,
        # Counted before the filter: rows of other roles below the bound still mean more.
        more=len(found) >= read or cut,
        size=size,
        read_at=monotonic(),
    )
    if read < size and len(found) >= read:
        # Fewer than the window's rows, with more below: for this send only.
        return _stand_in(window)
    # The whole window, or all the archive there is (a short read holds everything too).
    _keep(key, window)
    return window


def _rows_in_steps(scope: Scope, *, rows: int) -> list[RawMessageRow]:
    """window_rows(scope=scope, rows=rows), STEP_ROWS at a time, giving way to sends between
    statements: read in one, 1,000 rows and their case-folding held the GIL for ~5-10 ms, and
    a send arriving then (the second send to an imported session, while the first one's read
    ran) waited for it."""
    found: list[RawMessageRow] = []
    below = scope
    while len(found) < rows:
        background_yield()
        step = window_rows(scope=below, rows=min(STEP_ROWS, rows - len(found)))
        found += step
        if len(step) < STEP_ROWS or len(found) >= rows:
            break
        below = dataclasses.replace(scope, below_id=step[-1][0])
    return found


def _stand_in(window: ArchiveWindow) -> ArchiveWindow:
    return dataclasses.replace(window, read_again=True)


def archive_window_words_build(*, owner_id: int, session_id: int) -> bool:
    """Build the word list of the session's kept window, if it has none; whether it was built
    and kept (not when the window was replaced meanwhile: its successor gets its own)."""
    key = (owner_id, session_id)
    with _lock:
        kept = _windows.get(key)
    if kept is None or kept.word_rows is not None or kept.words_tried:
        return False
    word_rows, tried, runes = _list_beside(kept.runes, window_words_build(rows=kept.rows))
    listed = dataclasses.replace(kept, word_rows=word_rows, words_tried=tried, runes=runes)
    with _lock:
        if _windows.get(key) is not kept:
            return False
        _keep_locked(key, listed)
    return listed.word_rows is not None


def archive_window_truncated(
    *, owner_id: int, session_id: int, from_id: int, version: int, moved_to: int
) -> None:
    """The session's messages from `from_id` on were deleted (chat/services/sessions.py
    `message_truncate`), moving its messages_version from `version` to `moved_to`. A window
    kept at `version` and bound at or under `from_id` holds none of them: it still is what the
    archive holds, and is kept at the new version. Read again instead, it was a whole window
    before the first token of the send after every edit-and-resend (one in every question of
    the fidelity benchmark, which takes each question back). Other processes read theirs
    again (their versions no longer match)."""
    key = (owner_id, session_id)
    with _lock:
        kept = _windows.get(key)
        if kept is None or kept.version != version or kept.below_id > from_id:
            return
        _keep_locked(key, dataclasses.replace(kept, version=moved_to))


def _list_beside(runes: int, word_rows: WindowWords) -> tuple[WindowWords | None, bool, int]:
    """The list a window of `runes` keeps beside its rows, whether one was tried and left out,
    and the window's runes with it. The rows come first: a list past the entry's bound is left
    out (a chat of long replies, or 330k characters of varied prose with 42k distinct words,
    whose list would be ~2M), and marked tried, not built again to be thrown away."""
    if runes + word_rows.runes > ENTRY_RUNES_MAX:
        return None, True, runes
    return word_rows, False, runes + word_rows.runes


def archive_window_ready(
    *, owner_id: int, session_id: int, version: int, below_id: int | None
) -> bool:
    """Whether this process keeps a window of the session read at `version`, still trusted,
    with its word list (or tried for one), and bound at `below_id` at least (the session's
    anchor: a compaction since moves the next send's bound past it, maybe far enough that the
    send reads it all again)."""
    with _lock:
        kept = _windows.get((owner_id, session_id))
    return (
        kept is not None
        and kept.version == version
        and (kept.word_rows is not None or kept.words_tried)
        and kept.below_id >= (below_id or 0)
        and monotonic() - kept.read_at < ENTRY_SECONDS
    )


def _recallable(found: list[RawMessageRow]) -> list[ArchiveRow]:
    return [
        ArchiveRow(mid, role, created_at, content, content.casefold())
        for mid, role, status, created_at, content in found
        if role in _RECALLED_ROLES and status not in EXCLUDED_FROM_MODEL and content
    ]


def _within(rows: list[ArchiveRow]) -> tuple[list[ArchiveRow], bool]:
    """The newest of `rows` (newest first) whose text fits ROWS_RUNES_MAX, and whether any
    were left out."""
    held = 0
    for i, row in enumerate(rows):
        held += len(row.content) + len(row.folded)
        if held > ROWS_RUNES_MAX:
            return rows[:i], True
    return rows, False


def _keep(key: tuple[int, int], window: ArchiveWindow) -> None:
    with _lock:
        _keep_locked(key, window)


def _keep_locked(key: tuple[int, int], window: ArchiveWindow) -> None:
    """`window` kept under `key`, the least recently used dropped past CACHE_RUNES_MAX (the
    caller holds _lock)."""
    global _kept_runes
    old = _windows.pop(key, None)
    if old is not None:
        _kept_runes -= old.runes
    if window.runes > ENTRY_RUNES_MAX:
        return
    _windows[key] = window
    _kept_runes += window.runes
    while _kept_runes > CACHE_RUNES_MAX and _windows:
        _, dropped = _windows.popitem(last=False)
        _kept_runes -= dropped.runes


def archive_windows_forget() -> None:
    """Drop every kept window (tests: ids come back after a rolled-back test on SQLite)."""
    global _kept_runes
    with _lock:
        _windows.clear()
        _kept_runes = 0
