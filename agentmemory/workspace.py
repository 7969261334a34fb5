"""An agent's workspace: files its tools read and write, under `workspace/` in its memory
folder (agentmemory.store re-exports these functions: the store is the one facade callers use).
Names are checked in `agentmemory.paths`; writes go through `agentmemory.fileio`."""

from __future__ import annotations

import contextlib

from django.conf import settings
from django.core.files.storage import Storage

from agentmemory import fileio, folders, paths
from agentmemory.fileio import MemoryFull, MemoryNotFound, TooLarge
from agentmemory.paths import UnsafeName
from agentmemory.storage import get_memory_storage

WORKSPACE_MAX_BYTES = 1024 * 1024
WORKSPACE_MAX_FILES_LISTED = 5_000


def _workspace_files(storage: Storage, root: str, *, stop_at: int) -> list[str]:
    top = paths.workspace_dir(root=root)
    found: list[str] = []
    pending: list[tuple[str, int]] = [("", 1)]
    while pending and len(found) < stop_at:
        prefix, depth = pending.pop()
        dirs, files = fileio.listdir(storage, f"{top}/{prefix}".rstrip("/"))
        for filename in files:
            rel = f"{prefix}{filename}"
            with contextlib.suppress(UnsafeName):
                paths.filesystem_path(
                    storage=storage,
                    root=root,
                    name=paths.workspace_storage_name(root=root, path=rel),
                )
                found.append(rel)
        if depth >= paths.WORKSPACE_MAX_DEPTH:
            continue  # also what stops a symlink loop inside the folder
        for dirname in dirs:
            rel = f"{prefix}{dirname}"
            with contextlib.suppress(UnsafeName):
                paths.filesystem_path(
                    storage=storage,
                    root=root,
                    name=paths.workspace_storage_name(root=root, path=rel),
                )
                pending.append((f"{rel}/", depth + 1))
    return found


def workspace_list(*, agent_id: int) -> list[str]:
    """Workspace-relative paths of all files, sorted. Names we would refuse to write (hidden
    files, temp files, odd characters) and anything resolving outside the agent folder are
    left out rather than reported."""
    storage = get_memory_storage()
    root = folders.agent_root(storage=storage, agent_id=agent_id, create=False)
    if root is None:
        return []
    found = _workspace_files(storage, root, stop_at=WORKSPACE_MAX_FILES_LISTED)
    return sorted(found[:WORKSPACE_MAX_FILES_LISTED])


def workspace_read(*, agent_id: int, path: str) -> str:
    """A workspace file as text (invalid UTF-8 replaced). TooLarge above WORKSPACE_MAX_BYTES."""
    paths.workspace_relpath(path)
    storage = get_memory_storage()
    root = folders.agent_root(storage=storage, agent_id=agent_id, create=False)
    data = None
    if root is not None:
        name = paths.workspace_storage_name(root=root, path=path)
        data = fileio.read_bytes(
            storage=storage, root=root, name=name, max_bytes=WORKSPACE_MAX_BYTES
        )
    if data is None:
        raise MemoryNotFound(f"no workspace file {path!r}")
    return fileio.decode(data)


def workspace_write(*, agent_id: int, path: str, content: str) -> None:
    """Create or atomically replace a workspace file. TooLarge above WORKSPACE_MAX_BYTES;
    MemoryFull for a new file when the agent has AGENT_WORKSPACE_MAX_FILES already."""
    paths.workspace_relpath(path)
    if not isinstance(content, str):
        raise TypeError("workspace content must be a string")
    data = content.encode("utf-8")
    if len(data) > WORKSPACE_MAX_BYTES:
        raise TooLarge(f"workspace file is larger than {WORKSPACE_MAX_BYTES} bytes")
    storage = get_memory_storage()
    root = folders.agent_root(storage=storage, agent_id=agent_id, create=True)
    assert root is not None
    name = paths.workspace_storage_name(root=root, path=path)
    paths.filesystem_path(storage=storage, root=root, name=name)
    cap = settings.AGENT_WORKSPACE_MAX_FILES
    if not storage.exists(name) and len(_workspace_files(storage, root, stop_at=cap)) >= cap:
        raise MemoryFull(
            f"workspace is full: {cap} files (AGENT_WORKSPACE_MAX_FILES); overwrite a file "
            "instead of adding one"
        )
    fileio.replace(storage=storage, root=root, name=name, data=data)
