"""Low-level file I/O for agent memory, on a Django Storage: whole-file atomic replace, locks,
bounded reads. Every name is a storage name under an agent folder (`root`), checked again
here through agentmemory.paths.filesystem_path. See agentmemory.store for the guarantees."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

from django.core.files.base import ContentFile
from django.core.files.storage import Storage

from agentmemory import paths
from agentmemory.folders import FILE_MODE, makedirs_private
from agentmemory.paths import UnsafeName

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TooLarge(ValueError):
    """Content exceeds a size cap. Map to HTTP 413 (or 400)."""


class MemoryFull(TooLarge):
    """The agent already holds its maximum of entries or workspace files. Map to HTTP 409."""


class MemoryNotFound(FileNotFoundError):
    """The entry or workspace file does not exist. Map to HTTP 404."""


def file_mode(storage: Storage) -> int:
    mode = getattr(storage, "file_permissions_mode", None)
    return mode if mode is not None else FILE_MODE


_local_locks: dict[str, threading.RLock] = {}
_local_locks_guard = threading.Lock()


@contextlib.contextmanager
def local_lock(key: str) -> Iterator[None]:
    """In-process serialisation for backends without OS locks (keyed by storage name).
    Re-entrant because an append holds it around the whole-file replace that takes it too."""
    with _local_locks_guard:
        lock = _local_locks.setdefault(key, threading.RLock())
    with lock:
        yield


@contextlib.contextmanager
def flock(lock_path: str) -> Iterator[None]:
    # flock locks belong to the open file description, so each call opening its own fd makes
    # threads of one process exclude each other as well as separate processes.
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def exclusive(*, storage: Storage, root: str, name: str) -> Iterator[None]:
    """Exclusive section for `name`: OS lock on a dotfile next to it for the filesystem,
    in-process lock otherwise (see the module docstring for what that does not cover)."""
    absolute = paths.filesystem_path(storage=storage, root=root, name=name)
    if absolute is None:
        with local_lock(f"{id(storage)}:{name}"):
            yield
        return
    directory, base = os.path.split(absolute)
    makedirs(storage, directory)
    with flock(os.path.join(directory, f".{base}.lock")):
        yield


def makedirs(storage: Storage, directory: str) -> None:
    # Every level 0700 (os.makedirs would give the intermediate ones 0777 & ~umask).
    makedirs_private(directory)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(directory: str) -> None:
    # Makes the rename itself durable; best effort because not every filesystem allows it.
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def replace(*, storage: Storage, root: str, name: str, data: bytes) -> None:
    """Whole-file write: atomic on the filesystem, delete-then-save elsewhere."""
    absolute = paths.filesystem_path(storage=storage, root=root, name=name)
    if absolute is None:
        replace_generic(storage=storage, name=name, data=data)
        return
    directory, base = os.path.split(absolute)
    try:
        makedirs(storage, directory)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{base}.", suffix=".tmp")
    except (NotADirectoryError, FileExistsError) as exc:
        raise UnsafeName("a parent of this path is an existing file") from exc
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, file_mode(storage))
        # rename(2) replaces a symlink at the target rather than writing through it, so even
        # a symlink swapped in after the realpath check cannot redirect this write.
        os.replace(tmp, absolute)
    except IsADirectoryError as exc:
        raise UnsafeName("the path is an existing folder") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(directory)


def replace_generic(*, storage: Storage, name: str, data: bytes) -> None:
    with local_lock(f"{id(storage)}:{name}"):
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


def read_bytes(
    *, storage: Storage, root: str, name: str, max_bytes: int | None = None
) -> bytes | None:
    """None when the file does not exist."""
    paths.filesystem_path(storage=storage, root=root, name=name)
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


def listdir(storage: Storage, name: str) -> tuple[list[str], list[str]]:
    try:
        dirs, files = storage.listdir(name)
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    return list(dirs), list(files)


def modified_time(storage: Storage, name: str) -> datetime:
    try:
        return storage.get_modified_time(name)
    except (NotImplementedError, OSError):
        return EPOCH


def decode(data: bytes) -> str:
    # Hand-edited files may be in any encoding; keep what we can rather than refuse to read.
    return data.decode("utf-8", errors="replace")
