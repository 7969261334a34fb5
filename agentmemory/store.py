"""The agent memory store: daily notes, long-term entries and workspace files, as files in a
Django Storage (see `agentmemory.storage`). Names are checked in `agentmemory.paths` only.

Guarantees, by backend:

* FileSystemStorage (the default): every whole-file write goes to a temp file in the same
  directory, is fsynced and then os.replace()d over the target, so a reader sees the old file or
  the new one, never a torn one. Daily-note appends take an exclusive fcntl.flock on a lock
  file next to the note (`.YYYY-MM-DD.md.lock`) and write the block with O_APPEND while holding
  it, so concurrent threads and processes on one host (or on a filesystem with working flock)
  never interleave or lose a block. Entry writes and deletes hold a per-agent flock on
  `memory/entries/.lock`, so two concurrent writes of the same fact cannot both create a file.
* Any other backend (object storage ...): a whole-file write is delete-then-save, so a reader
  may briefly see no file, and the last writer wins. Appends and entry writes are read-modify-
  write serialised by an in-process lock only: two *processes* appending to the same note at
  the same moment can lose a block. Deployments on such a backend should append from a single
  worker (or accept that rare loss). Storage.save may rename on collision; we detect that,
  remove the stray copy and retry.

All functions take keyword-only arguments and raise `UnsafeName` (a ValueError) for a bad
agent id or name, `TooLarge` (a ValueError) for content over a cap and `MemoryNotFound` (a
FileNotFoundError) for a missing entry or workspace file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime

from django.core.files.base import ContentFile
from django.core.files.storage import Storage
from django.utils import timezone

from agentmemory import frontmatter, paths
from agentmemory.paths import UnsafeName
from agentmemory.storage import get_memory_storage
from agentmemory.text import bm25_scores, content_hash, jaccard, normalized, slugify_first_line

__all__ = [
    "DAILY_APPEND_MAX_BYTES",
    "ENTRY_MAX_CHARS",
    "NEAR_DUPLICATE_JACCARD",
    "WORKSPACE_MAX_BYTES",
    "EntryWriteResult",
    "MemoryEntry",
    "MemoryNotFound",
    "TooLarge",
    "UnsafeName",
    "daily_note_append",
    "daily_note_list",
    "daily_note_read",
    "entries_for_prompt",
    "entry_delete",
    "entry_list",
    "entry_read",
    "entry_search",
    "entry_write",
    "workspace_list",
    "workspace_read",
    "workspace_write",
]

# One fact or topic per entry; anything longer is a document and belongs in the workspace.
ENTRY_MAX_CHARS = 8_000
# A compaction batch with long tool outputs can be large, but not unboundedly so.
DAILY_APPEND_MAX_BYTES = 4 * 1024 * 1024
WORKSPACE_MAX_BYTES = 1024 * 1024
WORKSPACE_MAX_FILES_LISTED = 5_000
NEAR_DUPLICATE_JACCARD = 0.8
HEADING_MAX_CHARS = 200

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TooLarge(ValueError):
    """Content exceeds a size cap. Map to HTTP 413 (or 400)."""


class MemoryNotFound(FileNotFoundError):
    """The entry or workspace file does not exist. Map to HTTP 404."""


@dataclass(frozen=True)
class MemoryEntry:
    name: str  # the slug, without ".md"
    content: str
    created: datetime
    updated: datetime
    source_session_id: int | None
    source_message_id: int | None
    tags: tuple[str, ...]


@dataclass(frozen=True)
class EntryWriteResult:
    entry: MemoryEntry
    # False when an existing entry was updated: same name, or same/near-same content.
    created: bool


# --- low-level I/O -------------------------------------------------------------------------

_local_locks: dict[str, threading.RLock] = {}
_local_locks_guard = threading.Lock()


@contextlib.contextmanager
def _local_lock(key: str) -> Iterator[None]:
    """In-process serialisation for backends without OS locks (keyed by storage name).
    Re-entrant because an append holds it around the whole-file replace that takes it too."""
    with _local_locks_guard:
        lock = _local_locks.setdefault(key, threading.RLock())
    with lock:
        yield


@contextlib.contextmanager
def _flock(lock_path: str) -> Iterator[None]:
    # flock locks belong to the open file description, so each call opening its own fd makes
    # threads of one process exclude each other as well as separate processes.
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def _exclusive(*, storage: Storage, agent_id: int, name: str) -> Iterator[None]:
    """Exclusive section for `name`: OS lock on a dotfile next to it for the filesystem,
    in-process lock otherwise (see the module docstring for what that does not cover)."""
    absolute = paths.filesystem_path(storage=storage, agent_id=agent_id, name=name)
    if absolute is None:
        with _local_lock(f"{id(storage)}:{name}"):
            yield
        return
    directory, base = os.path.split(absolute)
    _makedirs(storage, directory)
    with _flock(os.path.join(directory, f".{base}.lock")):
        yield


def _makedirs(storage: Storage, directory: str) -> None:
    mode = getattr(storage, "directory_permissions_mode", None) or 0o777
    os.makedirs(directory, mode=mode, exist_ok=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(directory: str) -> None:
    # Makes the rename itself durable; best effort because not every filesystem allows it.
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _replace(*, storage: Storage, agent_id: int, name: str, data: bytes) -> None:
    """Whole-file write: atomic on the filesystem, delete-then-save elsewhere."""
    absolute = paths.filesystem_path(storage=storage, agent_id=agent_id, name=name)
    if absolute is None:
        _replace_generic(storage=storage, name=name, data=data)
        return
    directory, base = os.path.split(absolute)
    try:
        _makedirs(storage, directory)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{base}.", suffix=".tmp")
    except (NotADirectoryError, FileExistsError) as exc:
        raise UnsafeName("a parent of this path is an existing file") from exc
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        mode = getattr(storage, "file_permissions_mode", None)
        os.chmod(tmp, mode if mode is not None else 0o644)
        # rename(2) replaces a symlink at the target rather than writing through it, so even
        # a symlink swapped in after the realpath check cannot redirect this write.
        os.replace(tmp, absolute)
    except IsADirectoryError as exc:
        raise UnsafeName("the path is an existing folder") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(directory)


def _replace_generic(*, storage: Storage, name: str, data: bytes) -> None:
    with _local_lock(f"{id(storage)}:{name}"):
        for _attempt in range(3):
            if storage.exists(name):
                storage.delete(name)
            saved = storage.save(name, ContentFile(data))
            if saved == name:
                return
            # Another writer recreated `name` between our delete and save, and the backend
            # saved ours under an alternative name: drop that copy and try again.
            storage.delete(saved)
    raise OSError(f"could not replace {name!r}: concurrent writers kept recreating it")


def _read_bytes(
    *, storage: Storage, agent_id: int, name: str, max_bytes: int | None = None
) -> bytes | None:
    """None when the file does not exist."""
    paths.filesystem_path(storage=storage, agent_id=agent_id, name=name)
    try:
        if max_bytes is not None and storage.size(name) > max_bytes:
            raise TooLarge(f"file is larger than {max_bytes} bytes")
        with storage.open(name, "rb") as handle:
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    if max_bytes is not None and len(data) > max_bytes:  # grew between size() and read()
        raise TooLarge(f"file is larger than {max_bytes} bytes")
    return bytes(data)


def _listdir(storage: Storage, name: str) -> tuple[list[str], list[str]]:
    try:
        dirs, files = storage.listdir(name)
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    return list(dirs), list(files)


def _modified_time(storage: Storage, name: str) -> datetime:
    try:
        return storage.get_modified_time(name)
    except (NotImplementedError, OSError):
        return _EPOCH


def _decode(data: bytes) -> str:
    # Hand-edited files may be in any encoding; keep what we can rather than refuse to read.
    return data.decode("utf-8", errors="replace")


# --- daily notes ---------------------------------------------------------------------------


def _clean_heading(heading: str) -> str:
    # The heading must stay one markdown line: a newline in it would start a fake new block.
    return " ".join(str(heading).split())[:HEADING_MAX_CHARS] or "Note"


def daily_note_append(*, agent_id: int, day: date, heading: str, body: str) -> None:
    """Append `## heading` + body to the agent's note for `day` (created with a `# day` title
    when missing). Concurrent appends never interleave; see the module docstring."""
    storage = get_memory_storage()
    name = paths.daily_note_storage_name(agent_id=agent_id, day=day)
    block = f"\n## {_clean_heading(heading)}\n\n{body.strip()}\n".encode()
    if len(block) > DAILY_APPEND_MAX_BYTES:
        raise TooLarge(f"daily note block is larger than {DAILY_APPEND_MAX_BYTES} bytes")
    title = f"# {day.isoformat()}\n".encode()
    absolute = paths.filesystem_path(storage=storage, agent_id=agent_id, name=name)
    if absolute is None:
        with _local_lock(f"{id(storage)}:{name}"):
            existing = _read_bytes(storage=storage, agent_id=agent_id, name=name) or b""
            _replace(
                storage=storage,
                agent_id=agent_id,
                name=name,
                data=_joined(existing, title, block),
            )
        return
    with _exclusive(storage=storage, agent_id=agent_id, name=name):
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        mode = getattr(storage, "file_permissions_mode", None)
        fd = os.open(absolute, flags, mode if mode is not None else 0o644)
        try:
            size = os.fstat(fd).st_size
            last = os.pread(fd, 1, size - 1) if size else b""
            _write_all(fd, _joined(last, title, block)[len(last) :])
            os.fsync(fd)
        finally:
            os.close(fd)


def _joined(existing: bytes, title: bytes, block: bytes) -> bytes:
    if not existing:
        return title + block
    # A hand edit may have left the file without a final newline; keep the heading on its own
    # line so the note stays valid markdown.
    return existing + (b"" if existing.endswith(b"\n") else b"\n") + block


def daily_note_read(*, agent_id: int, day: date) -> str:
    """The note's text, or '' when there is none for that day."""
    storage = get_memory_storage()
    name = paths.daily_note_storage_name(agent_id=agent_id, day=day)
    data = _read_bytes(storage=storage, agent_id=agent_id, name=name)
    return _decode(data) if data is not None else ""


def daily_note_list(*, agent_id: int) -> list[date]:
    """Days that have a note, newest first."""
    storage = get_memory_storage()
    _dirs, files = _listdir(storage, paths.memory_dir(agent_id=agent_id))
    days = []
    for filename in files:
        with contextlib.suppress(UnsafeName):
            days.append(paths.parse_daily_note_filename(filename))
    return sorted(days, reverse=True)


# --- long-term entries ---------------------------------------------------------------------


def _load_entry(*, storage: Storage, agent_id: int, stem: str) -> MemoryEntry | None:
    name = paths.entry_storage_name(agent_id=agent_id, name=stem)
    data = _read_bytes(storage=storage, agent_id=agent_id, name=name)
    if data is None:
        return None
    parsed = frontmatter.parse(_decode(data))
    # A hand-written file without front matter still has a history: its modification time.
    fallback = None if parsed.created and parsed.updated else _modified_time(storage, name)
    created = parsed.created or parsed.updated or fallback or _EPOCH
    return MemoryEntry(
        name=stem,
        content=parsed.content,
        created=created,
        updated=parsed.updated or fallback or created,
        source_session_id=parsed.source_session_id,
        source_message_id=parsed.source_message_id,
        tags=parsed.tags,
    )


def _load_all(*, storage: Storage, agent_id: int) -> list[MemoryEntry]:
    _dirs, files = _listdir(storage, paths.entries_dir(agent_id=agent_id))
    entries = []
    for filename in files:
        if not paths.ENTRY_FILENAME_RE.fullmatch(filename):
            continue  # lock/temp dotfiles, editor backups, anything we would not have written
        try:
            entry = _load_entry(storage=storage, agent_id=agent_id, stem=filename[:-3])
        except UnsafeName:
            continue  # e.g. a symlink planted in entries/ pointing outside: not ours to read
        if entry is not None:
            entries.append(entry)
    entries.sort(key=lambda e: e.name)
    entries.sort(key=lambda e: e.updated, reverse=True)
    return entries


def _save_entry(*, storage: Storage, agent_id: int, entry: MemoryEntry) -> None:
    text = frontmatter.render(
        content=entry.content,
        created=entry.created,
        updated=entry.updated,
        source_session_id=entry.source_session_id,
        source_message_id=entry.source_message_id,
        tags=entry.tags,
    )
    name = paths.entry_storage_name(agent_id=agent_id, name=entry.name)
    _replace(storage=storage, agent_id=agent_id, name=name, data=text.encode())


def _checked_source_id(value: object, field: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value <= 0:
        raise ValueError(f"{field} must be a positive integer or None")
    return value


def _find_duplicate(content: str, entries: Iterable[MemoryEntry]) -> MemoryEntry | None:
    """Same normalised text first (cheap and exact), else the most similar entry at or above
    the Jaccard threshold, so "User likes green tea." and "the user likes green tea" merge."""
    entries = list(entries)
    wanted = content_hash(content)
    for entry in entries:
        if content_hash(entry.content) == wanted:
            return entry
    best: tuple[float, MemoryEntry] | None = None
    for entry in entries:
        similarity = jaccard(content, entry.content)
        if similarity >= NEAR_DUPLICATE_JACCARD and (best is None or similarity > best[0]):
            best = (similarity, entry)
    return best[1] if best else None


def _new_stem(content: str, taken: set[str]) -> str:
    base = slugify_first_line(content) or f"entry-{content_hash(content)[:12]}"
    stem, counter = base, 2
    while stem in taken:
        stem = f"{base}-{counter}"
        counter += 1
    return stem


def entry_write(
    *,
    agent_id: int,
    name: str | None,
    content: str,
    source_session_id: int | None = None,
    source_message_id: int | None = None,
    tags: Iterable[str] = (),
) -> EntryWriteResult:
    """Create or update one long-term entry.

    * `name` given and that entry exists: its content is replaced (created and, unless new ones
      are given, source ids and tags are kept).
    * Otherwise, if an entry with the same normalised text (case/punctuation/whitespace-
      insensitive hash) or a near-duplicate (token Jaccard >= 0.8) exists, that entry is
      updated instead of creating a second copy: new wording wins, tags are merged, the
      original source ids are kept (they say where the fact first came from).
    * Otherwise a new entry is created, at `name` or, when None, at a slug of the first line
      (`entry-<hash>` for a first line without ASCII words, `-2`, `-3` ... on collision).
    """
    content = content.strip() if isinstance(content, str) else ""
    if not normalized(content):
        raise ValueError("entry content is empty")
    if len(content) > ENTRY_MAX_CHARS:
        raise TooLarge(f"entry content is longer than {ENTRY_MAX_CHARS} characters")
    session_id = _checked_source_id(source_session_id, "source_session_id")
    message_id = _checked_source_id(source_message_id, "source_message_id")
    clean_tags = frontmatter.clean_tags(list(tags))
    stem = paths.entry_stem(name) if name is not None else None
    storage = get_memory_storage()
    lock_name = f"{paths.entries_dir(agent_id=agent_id)}/entries"
    with _exclusive(storage=storage, agent_id=agent_id, name=lock_name):
        now = timezone.now()
        existing = _load_entry(storage=storage, agent_id=agent_id, stem=stem) if stem else None
        if existing is not None:
            entry = MemoryEntry(
                name=existing.name,
                content=content,
                created=existing.created,
                updated=now,
                source_session_id=session_id or existing.source_session_id,
                source_message_id=message_id or existing.source_message_id,
                tags=clean_tags or existing.tags,
            )
            _save_entry(storage=storage, agent_id=agent_id, entry=entry)
            return EntryWriteResult(entry=entry, created=False)
        entries = _load_all(storage=storage, agent_id=agent_id)
        duplicate = _find_duplicate(content, entries)
        if duplicate is not None:
            entry = MemoryEntry(
                name=duplicate.name,
                content=content,
                created=duplicate.created,
                updated=now,
                source_session_id=duplicate.source_session_id or session_id,
                source_message_id=duplicate.source_message_id or message_id,
                tags=frontmatter.clean_tags([*duplicate.tags, *clean_tags]),
            )
            _save_entry(storage=storage, agent_id=agent_id, entry=entry)
            return EntryWriteResult(entry=entry, created=False)
        entry = MemoryEntry(
            name=stem or _new_stem(content, {e.name for e in entries}),
            content=content,
            created=now,
            updated=now,
            source_session_id=session_id,
            source_message_id=message_id,
            tags=clean_tags,
        )
        _save_entry(storage=storage, agent_id=agent_id, entry=entry)
        return EntryWriteResult(entry=entry, created=True)


def entry_read(*, agent_id: int, name: str) -> MemoryEntry:
    entry = _load_entry(
        storage=get_memory_storage(), agent_id=agent_id, stem=paths.entry_stem(name)
    )
    if entry is None:
        raise MemoryNotFound(f"no memory entry {name!r}")
    return entry


def entry_list(*, agent_id: int) -> list[MemoryEntry]:
    """All entries, most recently updated first (name breaks ties)."""
    return _load_all(storage=get_memory_storage(), agent_id=agent_id)


def entry_delete(*, agent_id: int, name: str) -> bool:
    """True when an entry was deleted, False when there was none."""
    storage = get_memory_storage()
    target = paths.entry_storage_name(agent_id=agent_id, name=name)
    lock_name = f"{paths.entries_dir(agent_id=agent_id)}/entries"
    with _exclusive(storage=storage, agent_id=agent_id, name=lock_name):
        paths.filesystem_path(storage=storage, agent_id=agent_id, name=target)
        if not storage.exists(target):
            return False
        storage.delete(target)
        return True


def _document(entry: MemoryEntry) -> str:
    return " ".join([entry.content, *entry.tags])


def entry_search(*, agent_id: int, query: str, limit: int = 10) -> list[tuple[float, MemoryEntry]]:
    """Entries matching `query`, best first, as (score, entry), at most `limit`.

    Score: Okapi BM25 (k1=1.2, b=0.75) of the query against each entry's content plus tags,
    over casefolded NFKC word tokens, where CJK characters count as single-character tokens
    plus adjacent-character bigrams, so Chinese/Japanese queries match without a segmenter.
    IDF is computed over this agent's entries only. Entries sharing no token score 0 and are
    not returned; equal scores are ordered newest updated first.
    """
    if limit <= 0:
        return []
    entries = entry_list(agent_id=agent_id)
    scores = bm25_scores(query=query, documents=[_document(e) for e in entries])
    # entries are already newest-first and sort() is stable, so ties keep that order.
    ranked = sorted(
        ((s, e) for s, e in zip(scores, entries, strict=True) if s > 0),
        key=lambda pair: pair[0],
        reverse=True,
    )
    return ranked[:limit]


def _render_for_prompt(entry: MemoryEntry) -> str:
    # Continuation lines are indented so a multi-line entry stays one list item.
    return "- " + re.sub(r"\n\s*", "\n  ", entry.content.strip())


def entries_for_prompt(*, agent_id: int, query: str, max_runes: int) -> str:
    """Long-term memory as a markdown list for the system prompt: entries relevant to `query`
    (the BM25 of `entry_search`) first, then the rest newest first, never longer than
    `max_runes` characters. An entry that does not fit is skipped and smaller ones after it
    may still go in, so one oversized entry cannot crowd out all memory. '' when none."""
    if max_runes <= 0:
        return ""
    entries = entry_list(agent_id=agent_id)
    scores = bm25_scores(query=query or "", documents=[_document(e) for e in entries])
    relevant = sorted(
        ((s, e) for s, e in zip(scores, entries, strict=True) if s > 0),
        key=lambda pair: pair[0],
        reverse=True,
    )
    ordered = [e for _, e in relevant] + [e for s, e in zip(scores, entries, strict=True) if s <= 0]
    lines: list[str] = []
    used = 0
    for entry in ordered:
        line = _render_for_prompt(entry)
        cost = len(line) + (1 if lines else 0)  # the joining newline
        if used + cost > max_runes:
            continue
        lines.append(line)
        used += cost
    return "\n".join(lines)


# --- workspace -----------------------------------------------------------------------------


def workspace_list(*, agent_id: int) -> list[str]:
    """Workspace-relative paths of all files, sorted. Names we would refuse to write (hidden
    files, temp files, odd characters) and anything resolving outside the agent folder are
    left out rather than reported."""
    storage = get_memory_storage()
    root = paths.workspace_dir(agent_id=agent_id)
    found: list[str] = []
    pending: list[tuple[str, int]] = [("", 1)]
    while pending and len(found) < WORKSPACE_MAX_FILES_LISTED:
        prefix, depth = pending.pop()
        dirs, files = _listdir(storage, f"{root}/{prefix}".rstrip("/"))
        for filename in files:
            rel = f"{prefix}{filename}"
            with contextlib.suppress(UnsafeName):
                paths.filesystem_path(
                    storage=storage,
                    agent_id=agent_id,
                    name=paths.workspace_storage_name(agent_id=agent_id, path=rel),
                )
                found.append(rel)
        if depth >= paths.WORKSPACE_MAX_DEPTH:
            continue  # also what stops a symlink loop inside the folder
        for dirname in dirs:
            rel = f"{prefix}{dirname}"
            with contextlib.suppress(UnsafeName):
                paths.filesystem_path(
                    storage=storage,
                    agent_id=agent_id,
                    name=paths.workspace_storage_name(agent_id=agent_id, path=rel),
                )
                pending.append((f"{rel}/", depth + 1))
    return sorted(found[:WORKSPACE_MAX_FILES_LISTED])


def workspace_read(*, agent_id: int, path: str) -> str:
    """A workspace file as text (invalid UTF-8 replaced). TooLarge above WORKSPACE_MAX_BYTES."""
    storage = get_memory_storage()
    name = paths.workspace_storage_name(agent_id=agent_id, path=path)
    data = _read_bytes(storage=storage, agent_id=agent_id, name=name, max_bytes=WORKSPACE_MAX_BYTES)
    if data is None:
        raise MemoryNotFound(f"no workspace file {path!r}")
    return _decode(data)


def workspace_write(*, agent_id: int, path: str, content: str) -> None:
    """Create or atomically replace a workspace file. TooLarge above WORKSPACE_MAX_BYTES."""
    storage = get_memory_storage()
    name = paths.workspace_storage_name(agent_id=agent_id, path=path)
    if not isinstance(content, str):
        raise TypeError("workspace content must be a string")
    data = content.encode("utf-8")
    if len(data) > WORKSPACE_MAX_BYTES:
        raise TooLarge(f"workspace file is larger than {WORKSPACE_MAX_BYTES} bytes")
    _replace(storage=storage, agent_id=agent_id, name=name, data=data)
