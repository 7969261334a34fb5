"""Which folder holds an agent's memory, and the proof that it is that agent's.

An agent's folder is `{storage root}/{Agent.memory_uuid}/` (a random UUID, not the database id:
ids start again at 1 with a fresh database, and a new user's agent 1 must not find a previous
agent 1's notes). The folder carries an owner marker, `.cadau-agent.json`, naming the agent's
UUID (and, for people reading it, its id and owner). A folder that exists without a matching
marker is refused (`FolderNotOwned`): it was not made by this agent, and whatever is in it is not
this agent's to read or add to. An operator resolves it (move the folder away, or write the
marker if it really is this agent's).

A new folder is created with its marker already inside: on the filesystem it is built under a
temporary name and renamed into place, so no other thread or process ever sees it without
one. Folders are 0700 and files 0600 (the default storage's modes): the chat text in the notes
is nobody else's business on a shared machine.

`agent_lookup` is the one place that reads the database (the agent's UUID and owner by id); the
store's tests replace it to exercise file behaviour without agents in a database.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage, Storage

from agentmemory.paths import UnsafeName, checked_agent_id, checked_root

MARKER_NAME = ".cadau-agent.json"
MARKER_MAX_BYTES = 4096
DIR_MODE = 0o700
FILE_MODE = 0o600


class FolderNotOwned(UnsafeName):
    """The agent's folder exists but its marker is missing or names another agent. Refused
    rather than read or written; map to HTTP 409."""


class AgentMissing(UnsafeName):
    """No agent with this id: nothing of it may be written."""


@dataclass(frozen=True)
class AgentRow:
    memory_uuid: uuid.UUID
    owner_id: int | None


def _agent_row_from_db(agent_id: int) -> AgentRow | None:
    from chat.models import Agent

    row = Agent.objects.filter(pk=agent_id).values_list("memory_uuid", "owner_id").first()
    return None if row is None else AgentRow(memory_uuid=row[0], owner_id=row[1])


agent_lookup: Callable[[int], AgentRow | None] = _agent_row_from_db

# Agents the caller already holds (a hook has session.agent): their folder is known without
# asking the database again. Scoped to a `with agent_known(...)` block, never a process-wide
# cache that could outlive the row it came from.
_known: ContextVar[dict[int, AgentRow] | None] = ContextVar("agentmemory_known", default=None)


@contextlib.contextmanager
def agent_known(agent: Any) -> Iterator[None]:
    """Within the block, store calls for `agent` (a chat.models.Agent just read from the
    database) resolve its folder from the object instead of a query."""
    row = AgentRow(memory_uuid=agent.memory_uuid, owner_id=agent.owner_id)
    token = _known.set({**(_known.get() or {}), int(agent.pk): row})
    try:
        yield
    finally:
        _known.reset(token)


def _lookup(agent_id: int) -> AgentRow | None:
    known = _known.get()
    if known is not None and agent_id in known:
        return known[agent_id]
    return agent_lookup(agent_id)


def marker_text(*, agent_uuid: uuid.UUID | str, agent_id: int, owner_id: int | None) -> bytes:
    body = {"agent_uuid": str(agent_uuid), "agent_id": agent_id, "owner_id": owner_id}
    return (json.dumps(body, sort_keys=True) + "\n").encode()


def _marker_matches(data: bytes | None, root: str) -> bool:
    if data is None or len(data) > MARKER_MAX_BYTES:
        return False
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(body, dict) and body.get("agent_uuid") == root


def _fs_root(storage: FileSystemStorage, root: str) -> str:
    return os.path.join(os.path.realpath(storage.location), root)


def _fs_state(storage: FileSystemStorage, root: str) -> bool:
    """True: the folder exists and is this agent's; False: there is none. Raises otherwise."""
    absolute = _fs_root(storage, root)
    if not os.path.lexists(absolute):
        return False
    if os.path.islink(absolute) or not os.path.isdir(absolute):
        raise FolderNotOwned(f"memory folder {root} is not a plain folder")
    try:
        fd = os.open(os.path.join(absolute, MARKER_NAME), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        data = None
    else:
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(MARKER_MAX_BYTES + 1)
    if not _marker_matches(data, root):
        raise FolderNotOwned(f"memory folder {root} exists without this agent's owner marker")
    return True


def _generic_state(storage: Storage, root: str) -> bool:
    marker = f"{root}/{MARKER_NAME}"
    try:
        with storage.open(marker, "rb") as handle:
            data = handle.read(MARKER_MAX_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        data = None
    if data is not None:
        if not _marker_matches(bytes(data), root):
            raise FolderNotOwned(f"memory folder {root} has another agent's owner marker")
        return True
    try:
        dirs, files = storage.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if dirs or files:
        raise FolderNotOwned(f"memory folder {root} exists without this agent's owner marker")
    return False


def _fs_create(storage: FileSystemStorage, root: str, marker: bytes) -> None:
    location = os.path.realpath(storage.location)
    os.makedirs(location, mode=DIR_MODE, exist_ok=True)
    # mkdtemp makes a 0700 folder; the marker goes in before the folder gets its real name.
    staging = tempfile.mkdtemp(dir=location, prefix=".new-agent-")
    try:
        fd = os.open(
            os.path.join(staging, MARKER_NAME),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
            FILE_MODE,
        )
        with os.fdopen(fd, "wb") as handle:
            handle.write(marker)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError, OSError):
            # Fails when another writer got there first (the folder is not empty): theirs
            # is as good as ours, and _fs_state below checks it.
            os.rename(staging, _fs_root(storage, root))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _generic_create(storage: Storage, root: str, marker: bytes) -> None:
    name = f"{root}/{MARKER_NAME}"
    saved = storage.save(name, ContentFile(marker))
    if saved != name:  # a concurrent creator saved it first; ours landed under another name
        storage.delete(saved)


def agent_root(*, storage: Storage, agent_id: int, create: bool) -> str | None:
    """The storage name of the agent's folder after checking its owner marker. None when it
    has no folder yet (or no such agent) and `create` is false; with `create`, the folder is
    made (marker first). Raises FolderNotOwned for a folder that is not the agent's."""
    row = _lookup(checked_agent_id(agent_id))
    if row is None:
        if create:
            raise AgentMissing(f"no agent {agent_id}")
        return None
    root = checked_root(str(row.memory_uuid))
    if isinstance(storage, FileSystemStorage):
        exists = _fs_state(storage, root)
        if not exists and create:
            _fs_create(storage, root, _marker_for(root, agent_id, row))
            exists = _fs_state(storage, root)
    else:
        exists = _generic_state(storage, root)
        if not exists and create:
            _generic_create(storage, root, _marker_for(root, agent_id, row))
            exists = _generic_state(storage, root)
    return root if exists else None


def _marker_for(root: str, agent_id: int, row: AgentRow) -> bytes:
    return marker_text(agent_uuid=root, agent_id=agent_id, owner_id=row.owner_id)


def makedirs_private(directory: str) -> None:
    """os.makedirs with every folder it creates at 0700 (os.makedirs applies `mode` to the
    last one only)."""
    missing = []
    current = directory
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, DIR_MODE)
