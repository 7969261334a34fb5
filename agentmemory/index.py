"""An agent's long-term entries, read once and kept: parsed entries, their prompt lines and a
BM25 index, per agent folder, in this process.

Every send to an agent ranks its entries for the system prompt. Reading and parsing every
entry file per send made that cost grow with the entry count (2,000 entries: 0.8 s a send).
Here a lookup first stats the entries folder: when its (inode, mtime) is what it was at the
last scan and that scan is recent (RESCAN_SECONDS), the cached entries serve as they are: one
stat per lookup. Otherwise it lists the folder (one scandir, a stat per file, no reads) and
compares each file's (inode, mtime, size) with what it read last time: only new or changed
files are read and parsed. Our own writes replace files by rename, which changes the folder's
mtime, so they are seen at once, from any process; a file edited in place by hand is seen
within RESCAN_SECONDS. A write through the store also marks its file to be read again
whatever its stamp says.

Other storage backends have no cheap per-file stamp (a remote listing per file would cost
what it saves), so there the entries are read on every lookup, as before; the BM25 index is
still built once per lookup instead of per query term.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from django.core.files.storage import FileSystemStorage, Storage

from agentmemory import fileio, frontmatter, paths
from agentmemory.paths import UnsafeName
from agentmemory.text import Bm25Index, tokens

CACHED_FOLDERS = 256  # agents whose entries stay in memory (least recently used dropped)
# How long the folder's own stamp vouches for its files. Adding, removing or replacing a file
# (all our writes: rename into place) changes the folder's mtime and is seen at once; only a
# file edited in place, by hand, waits up to this long to be seen.
RESCAN_SECONDS = 2.0


@dataclass(frozen=True)
class MemoryEntry:
    name: str  # the slug, without ".md"
    content: str
    created: datetime
    updated: datetime
    source_session_id: int | None
    source_message_id: int | None
    tags: tuple[str, ...]


def document(entry: MemoryEntry) -> str:
    """What BM25 ranks an entry by: its text and tags."""
    return " ".join([entry.content, *entry.tags])


def prompt_line(entry: MemoryEntry) -> str:
    # Continuation lines are indented so a multi-line entry stays one list item.
    return "- " + re.sub(r"\n\s*", "\n  ", entry.content.strip())


def load_entry(*, storage: Storage, root: str, stem: str) -> MemoryEntry | None:
    name = paths.entry_storage_name(root=root, name=stem)
    data = fileio.read_bytes(storage=storage, root=root, name=name)
    if data is None:
        return None
    parsed = frontmatter.parse(fileio.decode(data))
    # A hand-written file without front matter still has a history: its modification time.
    fallback = None if parsed.created and parsed.updated else fileio.modified_time(storage, name)
    created = parsed.created or parsed.updated or fallback or fileio.EPOCH
    return MemoryEntry(
        name=stem,
        content=parsed.content,
        created=created,
        updated=parsed.updated or fallback or created,
        source_session_id=parsed.source_session_id,
        source_message_id=parsed.source_message_id,
        tags=parsed.tags,
    )


@dataclass(frozen=True)
class _Item:
    entry: MemoryEntry
    counts: Counter[str]
    line: str


def item_for(entry: MemoryEntry) -> _Item:
    return _Item(entry=entry, counts=Counter(tokens(document(entry))), line=prompt_line(entry))


@dataclass
class EntrySet:
    """One folder's entries, most recently updated first (name breaks ties), with their
    prompt lines and BM25 index in the same order. Never mutated once built."""

    entries: list[MemoryEntry]
    lines: list[str]
    bm25: Bm25Index
    # filename -> (inode, mtime_ns, size) of the files this was built from, and their items.
    stamps: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    items: dict[str, _Item] = field(default_factory=dict)
    # The folder's own (inode, mtime_ns) and when the files were last stat'ed (monotonic):
    # the only fields that change after building (a rescan that found nothing new).
    folder_stamp: tuple[int, int] | None = None
    scanned_at: float = 0.0

    @classmethod
    def build(
        cls,
        items: dict[str, _Item],
        stamps: dict[str, tuple[int, int, int]],
        *,
        order: list[MemoryEntry] | None = None,
    ) -> EntrySet:
        """From parsed items; newest first unless `order` (the entries, as given) says."""
        if order is not None:
            ordered = [items[e.name] for e in order]
        else:
            ordered = sorted(items.values(), key=lambda i: i.entry.name)
            ordered.sort(key=lambda i: i.entry.updated, reverse=True)
        return cls(
            entries=[i.entry for i in ordered],
            lines=[i.line for i in ordered],
            bm25=Bm25Index([i.counts for i in ordered]),
            stamps=stamps,
            items=items,
        )


_cache: OrderedDict[tuple[int, str], EntrySet] = OrderedDict()
_cache_lock = threading.Lock()
# A lookup for one folder at a time: two sends to one agent do not both read its files.
_folder_locks: dict[tuple[int, str], threading.Lock] = {}

EMPTY = EntrySet(entries=[], lines=[], bm25=Bm25Index([]))


def _key(storage: Storage, root: str) -> tuple[int, str]:
    return (id(storage), paths.entries_dir(root=root))


# Entry files written through the store since the folder was last looked at: read again
# whatever their stamp says (a replaced file may reuse a freed inode, with the same size, in
# the same mtime tick).
_dirty: dict[tuple[int, str], set[str]] = {}


def forget(*, storage: Storage, root: str, stem: str) -> None:
    """After a write or delete of one entry through the store: it is read again next time."""
    with _cache_lock:
        _dirty.setdefault(_key(storage, root), set()).add(f"{stem}.md")


def forget_all() -> None:
    with _cache_lock:
        _cache.clear()
        _dirty.clear()


def _entries_path(storage: FileSystemStorage, root: str) -> str:
    directory = paths.filesystem_path(storage=storage, root=root, name=paths.entries_dir(root=root))
    assert directory is not None
    return directory


def _folder_stamp(directory: str) -> tuple[int, int] | None:
    try:
        st = os.stat(directory)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_ino, st.st_mtime_ns)


def _scan(directory: str, storage: FileSystemStorage, root: str) -> dict[str, tuple[int, int, int]]:
    """Entry filenames with their stamps; names we would never have written (lock and temp
    dotfiles, editor backups) and anything that resolves outside the folder are left out."""
    stamps: dict[str, tuple[int, int, int]] = {}
    try:
        scanner = os.scandir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return stamps
    with scanner:
        for item in scanner:
            if not paths.ENTRY_FILENAME_RE.fullmatch(item.name):
                continue
            if item.is_symlink():
                # e.g. a symlink planted in entries/ pointing outside: not ours to read.
                with contextlib.suppress(UnsafeName):
                    paths.filesystem_path(
                        storage=storage,
                        root=root,
                        name=paths.entry_storage_name(root=root, name=item.name),
                    )
                    with contextlib.suppress(OSError):
                        st = item.stat()
                        stamps[item.name] = (st.st_ino, st.st_mtime_ns, st.st_size)
                continue
            with contextlib.suppress(OSError):
                st = item.stat(follow_symlinks=False)
                if not item.is_dir(follow_symlinks=False):
                    stamps[item.name] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return stamps


def _load(storage: Storage, root: str, filenames: list[str]) -> dict[str, _Item]:
    items = {}
    for filename in filenames:
        try:
            entry = load_entry(storage=storage, root=root, stem=filename[:-3])
        except UnsafeName:
            continue
        if entry is not None:
            items[filename] = item_for(entry)
    return items


def _load_generic(storage: Storage, root: str) -> EntrySet:
    _dirs, files = fileio.listdir(storage, paths.entries_dir(root=root))
    names = [f for f in files if paths.ENTRY_FILENAME_RE.fullmatch(f)]
    return EntrySet.build(_load(storage, root, names), {})


def entry_set(*, storage: Storage, root: str | None) -> EntrySet:
    """The folder's entries as they are on disk now (see the module docstring)."""
    if root is None:
        return EMPTY
    if not isinstance(storage, FileSystemStorage):
        return _load_generic(storage, root)
    key = _key(storage, root)
    with _cache_lock:
        folder_lock = _folder_locks.setdefault(key, threading.Lock())
    with folder_lock:
        with _cache_lock:
            dirty = _dirty.pop(key, set())
            cached = _cache.get(key)
            if cached is not None:
                _cache.move_to_end(key)
        directory = _entries_path(storage, root)
        folder_stamp = _folder_stamp(directory)
        now = time.monotonic()
        if (
            cached is not None
            and not dirty
            and cached.folder_stamp == folder_stamp
            and now - cached.scanned_at < RESCAN_SECONDS
        ):
            # No file added, removed or replaced by rename since the last scan, which was
            # recent: an in-place edit by hand is seen at the next scan.
            return cached
        stamps = _scan(directory, storage, root)
        if cached is not None and not dirty and cached.stamps == stamps:
            cached.folder_stamp, cached.scanned_at = folder_stamp, now
            return cached
        previous = cached.items if cached is not None else {}
        old_stamps = cached.stamps if cached is not None else {}
        kept = {
            name: item
            for name, item in previous.items()
            if name in stamps and name not in dirty and old_stamps.get(name) == stamps[name]
        }
        changed = [name for name in stamps if name not in kept]
        fresh = _load(storage, root, changed)
        # A file that vanished between the scan and the read is simply not there.
        stamps = {name: stamp for name, stamp in stamps.items() if name in kept or name in fresh}
        built = EntrySet.build({**kept, **fresh}, stamps)
        built.folder_stamp, built.scanned_at = folder_stamp, now
        with _cache_lock:
            _cache[key] = built
            _cache.move_to_end(key)
            while len(_cache) > CACHED_FOLDERS:
                evicted, _ = _cache.popitem(last=False)
                _folder_locks.pop(evicted, None)
        return built
