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
from datetime import datetime
from time import monotonic

from chat.models import EXCLUDED_FROM_MODEL, MessageRole
from chat.search.archive_rows import (
    ArchiveRow,
    ArchiveWindow,
    matched_moved,
    named_moved,
    older_hits_keep,
    words_moved,
)
from chat.search.backends import RawMessageRow, Scope, window_rows
from chat.search.concepts import KindTexts
from chat.search.window_words import WindowWords, window_words_build

__all__ = [
    "WINDOW_ROWS",
    "ArchiveRow",
    "ArchiveWindow",
    "archive_window_read",
    "archive_window_ready",
    "archive_window_truncated",
    "archive_window_words_build",
    "archive_windows_forget",
    "older_hits_keep",
]
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
# A bound moved by more rows than this is read as a new window (one statement either way).
_DELTA_ROWS_MAX = 200
# Rows read per statement by a background read (archive_window_read's `in_steps`).
STEP_ROWS = 100
_RECALLED_ROLES = frozenset((MessageRole.USER, MessageRole.ASSISTANT))


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
    age = monotonic() - kept.read_at if kept is not None else 0.0
    stale = age >= ENTRY_SECONDS
    if (
        kept is not None
        and kept.size == size
        and kept.version == version
        and kept.below_id <= below_id
        # Past twice its time (its read again never came: the warming queue was full), it
        # is not trusted: a send reads the newest rows, as with none kept.
        and (not stale or (cold_rows and age < 2 * ENTRY_SECONDS))
    ):
        if kept.below_id == below_id:
            with _lock:
                if key in _windows:
                    _windows.move_to_end(key)
            return _stand_in(kept) if stale else kept
        moved = _moved(kept, scope=scope, below_id=below_id, version=version, size=size)
        if moved is not None:
            _keep(key, moved)
            return _stand_in(moved) if stale else moved
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
        return dataclasses.replace(window, read_again=True, partial=True)
    # The whole window, or all the archive there is (a short read holds everything too).
    if in_steps:
        # A background read: a send or a truncation may have kept a newer one meanwhile.
        _keep_unless_newer(key, window)
    else:
        _keep(key, window)
    return window


def _moved(
    kept: ArchiveWindow, *, scope: Scope, below_id: int, version: int, size: int
) -> ArchiveWindow | None:
    """`kept` with its bound moved up to `below_id`: the rows it passed read (one statement)
    and put on top, the oldest fallen off the end; None past _DELTA_ROWS_MAX of them (read
    as a new window then)."""
    found = window_rows(scope=scope, rows=_DELTA_ROWS_MAX, from_id=kept.below_id)
    if len(found) >= _DELTA_ROWS_MAX:
        return None
    added = _recallable(found)
    added_texts = KindTexts([r.folded for r in added])
    rows = [*added, *kept.rows]
    within, cut = _within(rows[:size])
    return _window(
        below_id=below_id,
        version=version,
        rows=within,
        more=kept.more or len(rows) > size or cut,
        size=size,
        read_at=kept.read_at,
        # A copy: the entries of a bound this window no longer has are never asked for.
        older_hits=dict(kept.older_hits),
        matched=matched_moved(kept, added=added, rows=within),
        named=named_moved(kept, added=added, texts=added_texts, rows=within),
        dates={m: d for m, d in kept.dates.items() if within and m >= within[-1].id},
        # A superset of the words once rows fall off: a kind's member found among them is
        # looked for in the rows, and found or not.
        words=words_moved(kept, added=added_texts),
        word_rows=kept.word_rows.gained(added) if kept.word_rows is not None else None,
        words_tried=kept.words_tried,
    )


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


def _keep_unless_newer(key: tuple[int, int], window: ArchiveWindow) -> None:
    """`window` kept unless the one kept is newer (a later version, or the same one bound
    higher): versions only go up, and a session's bound moves forward with its turns."""
    with _lock:
        kept = _windows.get(key)
        if kept is not None and (kept.version, kept.below_id) > (window.version, window.below_id):
            return
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
