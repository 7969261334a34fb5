"""The agent memory store: daily notes, long-term entries and workspace files, as files in a
Django Storage (see `agentmemory.storage`), in the agent's own folder named by its random
`memory_uuid` and marked as its own (`agentmemory.folders`: a folder without the agent's marker
is refused with FolderNotOwned). Names are checked in `agentmemory.paths` only. Files are 0600
and folders 0700 on the default backend. An agent holds at most AGENT_MEMORY_MAX_ENTRIES
entries and AGENT_WORKSPACE_MAX_FILES workspace files (MemoryFull past that).

Entries are cached per folder and revalidated by a stat per file (`agentmemory.index`), so
ranking them for a prompt does not re-read every file on every send.

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
agent id or name, `TooLarge` (a ValueError) for content over a cap (`MemoryFull`, a TooLarge,
for a full agent), `FolderNotOwned` (an UnsafeName) for a folder that is not the agent's and
`MemoryNotFound` (a FileNotFoundError) for a missing entry or workspace file. Reading an agent
that has no folder yet gives empty results; the first write creates the folder.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date

from django.conf import settings
from django.core.files.storage import Storage
from django.utils import timezone

from agentmemory import fileio, folders, frontmatter, index, paths
from agentmemory.fileio import MemoryFull, MemoryNotFound, TooLarge
from agentmemory.folders import FolderNotOwned
from agentmemory.index import MemoryEntry
from agentmemory.paths import UnsafeName
from agentmemory.storage import get_memory_storage
from agentmemory.text import content_hash, jaccard, normalized, slugify_first_line
from agentmemory.workspace import (
    WORKSPACE_MAX_BYTES,
    workspace_list,
    workspace_read,
    workspace_write,
)

__all__ = [
    "DAILY_APPEND_MAX_BYTES",
    "ENTRY_MAX_CHARS",
    "NEAR_DUPLICATE_JACCARD",
    "WORKSPACE_MAX_BYTES",
    "EntryWriteResult",
    "FolderNotOwned",
    "MemoryEntry",
    "MemoryFull",
    "MemoryNotFound",
    "TooLarge",
    "UnsafeName",
    "daily_note_append",
    "daily_note_list",
    "daily_note_read",
    "entries_for_prompt",
    "entries_prompt_text",
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
NEAR_DUPLICATE_JACCARD = 0.8
HEADING_MAX_CHARS = 200


@dataclass(frozen=True)
class EntryWriteResult:
    entry: MemoryEntry
    # False when an existing entry was updated: same name, or same/near-same content.
    created: bool


def _root(storage: Storage, agent_id: int, *, create: bool = False) -> str | None:
    return folders.agent_root(storage=storage, agent_id=agent_id, create=create)


def _write_root(storage: Storage, agent_id: int) -> str:
    root = _root(storage, agent_id, create=True)
    assert root is not None
    return root


# --- daily notes ---------------------------------------------------------------------------


def _clean_heading(heading: str) -> str:
    # The heading must stay one markdown line: a newline in it would start a fake new block.
    return " ".join(str(heading).split())[:HEADING_MAX_CHARS] or "Note"


def daily_note_append(*, agent_id: int, day: date, heading: str, body: str) -> None:
    """Append `## heading` + body to the agent's note for `day` (created with a `# day` title
    when missing). Concurrent appends never interleave; see the module docstring."""
    storage = get_memory_storage()
    filename = paths.daily_note_filename(day)
    block = f"\n## {_clean_heading(heading)}\n\n{body.strip()}\n".encode()
    if len(block) > DAILY_APPEND_MAX_BYTES:
        raise TooLarge(f"daily note block is larger than {DAILY_APPEND_MAX_BYTES} bytes")
    root = _write_root(storage, agent_id)
    name = f"{paths.memory_dir(root=root)}/{filename}"
    title = f"# {day.isoformat()}\n".encode()
    absolute = paths.filesystem_path(storage=storage, root=root, name=name)
    if absolute is None:
        with fileio.local_lock(f"{id(storage)}:{name}"):
            existing = fileio.read_bytes(storage=storage, root=root, name=name) or b""
            fileio.replace(
                storage=storage, root=root, name=name, data=_joined(existing, title, block)
            )
        return
    with fileio.exclusive(storage=storage, root=root, name=name):
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(absolute, flags, fileio.file_mode(storage))
        try:
            size = os.fstat(fd).st_size
            last = os.pread(fd, 1, size - 1) if size else b""
            fileio.write_all(fd, _joined(last, title, block)[len(last) :])
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
    filename = paths.daily_note_filename(day)
    root = _root(storage, agent_id)
    if root is None:
        return ""
    name = f"{paths.memory_dir(root=root)}/{filename}"
    data = fileio.read_bytes(storage=storage, root=root, name=name)
    return fileio.decode(data) if data is not None else ""


def daily_note_list(*, agent_id: int) -> list[date]:
    """Days that have a note, newest first."""
    storage = get_memory_storage()
    root = _root(storage, agent_id)
    if root is None:
        return []
    folder = paths.memory_dir(root=root)
    _dirs, files = fileio.listdir(storage, folder)
    days = []
    for filename in files:
        with contextlib.suppress(UnsafeName):
            day = paths.parse_daily_note_filename(filename)
            # As the workspace listing: a note that resolves outside the agent folder (a
            # symlink planted there) cannot be read, so it is not offered either.
            paths.filesystem_path(storage=storage, root=root, name=f"{folder}/{filename}")
            days.append(day)
    return sorted(days, reverse=True)


# --- long-term entries ---------------------------------------------------------------------


def _save_entry(*, storage: Storage, root: str, entry: MemoryEntry) -> None:
    text = frontmatter.render(
        content=entry.content,
        created=entry.created,
        updated=entry.updated,
        source_session_id=entry.source_session_id,
        source_message_id=entry.source_message_id,
        tags=entry.tags,
    )
    name = paths.entry_storage_name(root=root, name=entry.name)
    try:
        fileio.replace(storage=storage, root=root, name=name, data=text.encode())
    finally:
        index.forget(storage=storage, root=root, stem=entry.name)


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
      (`entry-<hash>` for a first line without ASCII words, `-2`, `-3` ... on collision);
      MemoryFull when the agent already has AGENT_MEMORY_MAX_ENTRIES entries.
    """
    content = _content_checked(content)
    session_id = _checked_source_id(source_session_id, "source_session_id")
    message_id = _checked_source_id(source_message_id, "source_message_id")
    clean_tags = frontmatter.clean_tags(list(tags))
    stem = paths.entry_stem(name) if name is not None else None
    storage = get_memory_storage()
    root = _write_root(storage, agent_id)
    lock_name = f"{paths.entries_dir(root=root)}/entries"
    with fileio.exclusive(storage=storage, root=root, name=lock_name):
        return _entry_upsert(
            storage=storage,
            root=root,
            stem=stem,
            content=content,
            session_id=session_id,
            message_id=message_id,
            tags=clean_tags,
        )


def _content_checked(content: str) -> str:
    """The entry's text, stripped; ValueError when empty, TooLarge over ENTRY_MAX_CHARS."""
    content = content.strip() if isinstance(content, str) else ""
    if not normalized(content):
        raise ValueError("entry content is empty")
    if len(content) > ENTRY_MAX_CHARS:
        raise TooLarge(f"entry content is longer than {ENTRY_MAX_CHARS} characters")
    return content


def _entry_upsert(
    *,
    storage: Storage,
    root: str,
    stem: str | None,
    content: str,
    session_id: int | None,
    message_id: int | None,
    tags: tuple[str, ...],
) -> EntryWriteResult:
    """entry_write's three cases (see there), run under the entries lock."""
    now = timezone.now()
    existing = index.load_entry(storage=storage, root=root, stem=stem) if stem is not None else None
    if existing is not None:
        entry = MemoryEntry(
            name=existing.name,
            content=content,
            created=existing.created,
            updated=now,
            source_session_id=session_id or existing.source_session_id,
            source_message_id=message_id or existing.source_message_id,
            tags=tags or existing.tags,
        )
        _save_entry(storage=storage, root=root, entry=entry)
        return EntryWriteResult(entry=entry, created=False)
    entries = index.entry_set(storage=storage, root=root).entries
    duplicate = _find_duplicate(content, entries)
    if duplicate is not None:
        entry = MemoryEntry(
            name=duplicate.name,
            content=content,
            created=duplicate.created,
            updated=now,
            source_session_id=duplicate.source_session_id or session_id,
            source_message_id=duplicate.source_message_id or message_id,
            tags=frontmatter.clean_tags([*duplicate.tags, *tags]),
        )
        _save_entry(storage=storage, root=root, entry=entry)
        return EntryWriteResult(entry=entry, created=False)
    cap = settings.AGENT_MEMORY_MAX_ENTRIES
    if len(entries) >= cap:
        raise MemoryFull(
            f"memory is full: {cap} entries (AGENT_MEMORY_MAX_ENTRIES); update or delete "
            "an entry instead of adding one"
        )
    entry = MemoryEntry(
        name=stem or _new_stem(content, {e.name for e in entries}),
        content=content,
        created=now,
        updated=now,
        source_session_id=session_id,
        source_message_id=message_id,
        tags=tags,
    )
    _save_entry(storage=storage, root=root, entry=entry)
    return EntryWriteResult(entry=entry, created=True)


def entry_read(*, agent_id: int, name: str) -> MemoryEntry:
    stem = paths.entry_stem(name)
    storage = get_memory_storage()
    root = _root(storage, agent_id)
    entry = index.load_entry(storage=storage, root=root, stem=stem) if root else None
    if entry is None:
        raise MemoryNotFound(f"no memory entry {name!r}")
    return entry


class EntryList(list[MemoryEntry]):
    """What `entry_list` returns: the entries, plus the cached index they came from, so that
    `entries_prompt_text` can rank them without tokenising them again."""

    entry_set: index.EntrySet | None = None


def entry_list(*, agent_id: int) -> list[MemoryEntry]:
    """All entries, most recently updated first (name breaks ties)."""
    storage = get_memory_storage()
    entries = index.entry_set(storage=storage, root=_root(storage, agent_id))
    listed = EntryList(entries.entries)
    listed.entry_set = entries
    return listed


def entry_update(
    *, agent_id: int, name: str, content: str, tags: Iterable[str] | None = None
) -> MemoryEntry:
    """Replace an existing entry's text, and its tags when `tags` is given (an empty list
    clears them). Never creates and never merges into another entry: MemoryNotFound when the
    entry is not there once the lock is held, so an edit racing a delete cannot bring it back."""
    content = content.strip() if isinstance(content, str) else ""
    if not normalized(content):
        raise ValueError("entry content is empty")
    if len(content) > ENTRY_MAX_CHARS:
        raise TooLarge(f"entry content is longer than {ENTRY_MAX_CHARS} characters")
    stem = paths.entry_stem(name)
    storage = get_memory_storage()
    root = _root(storage, agent_id)
    if root is None:
        raise MemoryNotFound(f"no memory entry {name!r}")
    lock_name = f"{paths.entries_dir(root=root)}/entries"
    with fileio.exclusive(storage=storage, root=root, name=lock_name):
        existing = index.load_entry(storage=storage, root=root, stem=stem)
        if existing is None:
            raise MemoryNotFound(f"no memory entry {name!r}")
        entry = MemoryEntry(
            name=existing.name,
            content=content,
            created=existing.created,
            updated=timezone.now(),
            source_session_id=existing.source_session_id,
            source_message_id=existing.source_message_id,
            tags=frontmatter.clean_tags(list(tags)) if tags is not None else existing.tags,
        )
        _save_entry(storage=storage, root=root, entry=entry)
        return entry


def entry_delete(*, agent_id: int, name: str) -> bool:
    """True when an entry was deleted, False when there was none."""
    stem = paths.entry_stem(name)
    storage = get_memory_storage()
    root = _root(storage, agent_id)
    if root is None:
        return False
    target = paths.entry_storage_name(root=root, name=stem)
    lock_name = f"{paths.entries_dir(root=root)}/entries"
    with fileio.exclusive(storage=storage, root=root, name=lock_name):
        paths.filesystem_path(storage=storage, root=root, name=target)
        if not storage.exists(target):
            return False
        try:
            storage.delete(target)
        finally:
            index.forget(storage=storage, root=root, stem=stem)
        return True


def _ranked(entries: index.EntrySet, query: str) -> list[tuple[float, int]]:
    """(score, position) of the entries sharing a term with `query`, best first; entries are
    newest-first already and sort() is stable, so ties keep that order."""
    scores = entries.bm25.scores(query or "")
    return sorted(
        ((s, i) for i, s in enumerate(scores) if s > 0), key=lambda pair: pair[0], reverse=True
    )


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
    storage = get_memory_storage()
    entries = index.entry_set(storage=storage, root=_root(storage, agent_id))
    return [(s, entries.entries[i]) for s, i in _ranked(entries, query)[:limit]]


def entries_for_prompt(*, agent_id: int, query: str, max_runes: int) -> str:
    """Long-term memory as a markdown list for the system prompt (`entries_prompt_text` of the
    agent's entries)."""
    if max_runes <= 0:
        return ""
    return entries_prompt_text(
        entries=entry_list(agent_id=agent_id), query=query, max_runes=max_runes
    )


def entries_prompt_text(*, entries: list[MemoryEntry], query: str, max_runes: int) -> str:
    """`entries` (newest first, as `entry_list` returns them) as a markdown list for the system
    prompt: those relevant to `query` (the BM25 of `entry_search`) first, then the rest newest
    first, never longer than `max_runes` characters. An entry that does not fit is skipped and
    smaller ones after it may still go in, so one oversized entry cannot crowd out all memory.
    '' when none. No I/O: one load of the entries serves several queries, and the list from
    `entry_list` carries its cached index, so nothing is tokenised again."""
    if max_runes <= 0 or not entries:
        return ""
    ranked = getattr(entries, "entry_set", None)
    if ranked is None:
        ranked = index.EntrySet.build(
            {e.name: index.item_for(e) for e in entries}, {}, order=list(entries)
        )
    relevant = [i for _, i in _ranked(ranked, query)]
    chosen = set(relevant)
    order = relevant + [i for i in range(len(ranked.entries)) if i not in chosen]
    lines: list[str] = []
    used = 0
    for position in order:
        line = ranked.lines[position]
        cost = len(line) + (1 if lines else 0)  # the joining newline
        if used + cost > max_runes:
            continue
        lines.append(line)
        used += cost
        if used >= max_runes:
            break  # nothing more can fit
    return "\n".join(lines)
