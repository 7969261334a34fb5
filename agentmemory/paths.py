"""Name safety for agent memory, in one place.

Every name a user, the API or a model supplies goes through a function here before it becomes a
storage name, so "can this escape the agent's folder?" has exactly one answer to audit.

Layout (storage names, always forward slashes, relative to the storage root), where {root} is
the agent's `memory_uuid` (agentmemory/folders.py resolves and checks it):

    {root}/.cadau-agent.json              owner marker
    {root}/memory/YYYY-MM-DD.md           daily notes
    {root}/memory/entries/<slug>.md       long-term entries
    {root}/workspace/<seg>/<seg>/...      agent workspace files

The rules are whitelists, not blacklists: rather than trying to recognise every spelling of
"..", "/", "%2e%2e%2f", fullwidth solidus, NUL and so on, a name must consist only of
characters we know are inert. Anything else raises `UnsafeName` (a ValueError, so API code can
map it to a 400 without importing this module's internals).

For a FileSystemStorage the lexical check is not enough: a symlink planted inside the agent's
folder could point anywhere. `filesystem_path` therefore resolves the real path (which follows
every symlink in the parents as well as the final component) and insists it still lies under
the real agent root.
"""

from __future__ import annotations

import os
import re
from datetime import date

from django.core.exceptions import SuspiciousFileOperation
from django.core.files.storage import FileSystemStorage, Storage


class UnsafeName(ValueError):
    """A supplied name is not acceptable as a memory/workspace name. Map to HTTP 400."""


# Entry files: a lowercase slug. The first character is alphanumeric so no entry can be a
# dotfile (lock and temp files are dotfiles and must never show up as entries).
ENTRY_STEM_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,80}")
ENTRY_FILENAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,80}\.md")
# [0-9], not \d: in Python \d also matches fullwidth and other Unicode digits.
DAILY_FILENAME_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})\.md")

# Workspace paths: ASCII-only segments. Excluding everything non-ASCII is what rules out
# lookalike separators (U+2215, U+FF0F, U+2024 ...) without having to enumerate them; a segment
# may not start with "." (no "..", no hidden files) nor end with "." (Windows strips it, which
# would make two names alias one file on SMB-backed storage).
WORKSPACE_SEGMENT_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9_-])?")
WORKSPACE_MAX_DEPTH = 8
WORKSPACE_MAX_PATH_CHARS = 255
# Device names that Windows and some SMB servers treat specially whatever the extension.
_RESERVED_STEMS = frozenset(
    ["con", "prn", "aux", "nul"] + [f"com{i}" for i in range(10)] + [f"lpt{i}" for i in range(10)]
)

# Above this no real database id exists.
_MAX_AGENT_ID = 2**63 - 1


def checked_agent_id(agent_id: object) -> int:
    """agent_id is looked up in the database, so it must be a plain positive int (bool is an
    int subclass and "1" would be a str that happens to look right: both refused)."""
    if type(agent_id) is not int or not 0 < agent_id <= _MAX_AGENT_ID:
        raise UnsafeName(f"agent_id must be a positive integer, got {agent_id!r}")
    return agent_id


# A folder name is a canonical (lower-case, hyphenated) UUID and nothing else.
ROOT_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def checked_root(root: object) -> str:
    if not isinstance(root, str) or not ROOT_RE.fullmatch(root):
        raise UnsafeName(f"agent folder must be a canonical UUID, got {root!r}"[:200])
    return root


def memory_dir(*, root: str) -> str:
    return f"{checked_root(root)}/memory"


def entries_dir(*, root: str) -> str:
    return f"{memory_dir(root=root)}/entries"


def workspace_dir(*, root: str) -> str:
    return f"{checked_root(root)}/workspace"


def entry_stem(name: object) -> str:
    """Accepts an entry name with or without the `.md` suffix; returns the bare slug."""
    if not isinstance(name, str):
        raise UnsafeName("entry name must be a string")
    stem = name[:-3] if name.endswith(".md") else name
    if not ENTRY_STEM_RE.fullmatch(stem):
        raise UnsafeName(f"bad entry name {name[:100]!r}: use [a-z0-9][a-z0-9_-]{{0,80}}")
    return stem


def entry_storage_name(*, root: str, name: object) -> str:
    return f"{entries_dir(root=root)}/{entry_stem(name)}.md"


def daily_note_filename(day: object) -> str:
    # datetime is a date subclass; a datetime here is almost certainly a caller mixing up
    # timezones, and its isoformat() would not match the daily pattern anyway.
    if not isinstance(day, date) or type(day).__name__ == "datetime":
        raise UnsafeName("day must be a datetime.date")
    return f"{day.isoformat()}.md"


def parse_daily_note_filename(filename: object) -> date:
    """`YYYY-MM-DD.md` that is also a real calendar date (2024-02-30 is refused)."""
    if not isinstance(filename, str):
        raise UnsafeName("daily note name must be a string")
    match = DAILY_FILENAME_RE.fullmatch(filename)
    if not match:
        raise UnsafeName(f"bad daily note name {filename[:100]!r}: use YYYY-MM-DD.md")
    try:
        return date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError as exc:
        raise UnsafeName(f"bad daily note date {filename!r}") from exc


def workspace_relpath(path: object) -> str:
    """Validates a workspace-relative path and returns it unchanged. No normalisation on
    purpose: if we "fixed" `a//b` or `./a` we would be guessing what the caller meant, and two
    spellings of one file would defeat any per-name bookkeeping the API layer does."""
    if not isinstance(path, str):
        raise UnsafeName("workspace path must be a string")
    if not path or len(path) > WORKSPACE_MAX_PATH_CHARS:
        raise UnsafeName(f"workspace path must be 1..{WORKSPACE_MAX_PATH_CHARS} characters")
    segments = path.split("/")
    if len(segments) > WORKSPACE_MAX_DEPTH:
        raise UnsafeName(f"workspace path deeper than {WORKSPACE_MAX_DEPTH} levels")
    for segment in segments:
        # An empty segment covers a leading "/" (absolute path), "a//b" and a trailing "/".
        if not WORKSPACE_SEGMENT_RE.fullmatch(segment):
            raise UnsafeName(
                f"bad workspace path {path[:100]!r}: segments use [A-Za-z0-9._-], may not "
                "start or end with '.'"
            )
        if segment.split(".", 1)[0].lower() in _RESERVED_STEMS:
            raise UnsafeName(f"reserved device name in workspace path {path[:100]!r}")
    return path


def workspace_storage_name(*, root: str, path: object) -> str:
    return f"{workspace_dir(root=root)}/{workspace_relpath(path)}"


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def filesystem_path(*, storage: Storage, root: str, name: str) -> str | None:
    """For a FileSystemStorage: the absolute path of `name`, after proving that its real path
    (all symlinks resolved, in the parents too) is inside the real agent folder. For any other
    backend: None, because object stores have no symlinks and no path to follow.

    The agent folder itself is anchored at realpath(storage location)/root, so a symlinked
    RUNTIME_DIR works but a per-agent folder redirected elsewhere by a symlink is refused.

    This narrows but cannot close a race with someone swapping a parent for a symlink between
    the check and the open; whoever can do that already has write access to RUNTIME_DIR.
    """
    if not isinstance(storage, FileSystemStorage):
        return None
    root = checked_root(root)
    if name != root and not name.startswith(root + "/"):
        raise UnsafeName("storage name is not under the agent folder")
    try:
        absolute = storage.path(name)  # safe_join: lexical containment in the location
    except SuspiciousFileOperation as exc:
        raise UnsafeName(str(exc)) from exc
    real_root = os.path.join(os.path.realpath(storage.location), root)
    if os.path.lexists(real_root) and os.path.realpath(real_root) != real_root:
        raise UnsafeName("agent folder is a symlink")
    if not _is_within(os.path.realpath(absolute), real_root):
        raise UnsafeName("path resolves outside the agent folder")
    return absolute
