"""Which Django Storage holds agent memory.

`settings.AGENT_MEMORY_STORAGE` (string, default ""):

* ""                   -> FileSystemStorage(location=settings.RUNTIME_DIR), files 0600 and
                          folders 0700. The only backend
                          with atomic replace, cross-process append locks and symlink checks.
* a STORAGES alias     -> `django.core.files.storage.storages[alias]`, so a deployment
                          configures S3/shared storage with OPTIONS the usual Django way, e.g.
                          STORAGES["agent_memory"] = {"BACKEND": "storages.backends.s3.S3Storage",
                          "OPTIONS": {...}} and AGENT_MEMORY_STORAGE="agent_memory".
* a dotted path        -> a Storage subclass (instantiated without arguments) or a zero-argument
                          callable returning a Storage.

An alias is looked up first, so an alias that happens to contain a dot still works.
"""

from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import FileSystemStorage, Storage, storages
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from agentmemory.folders import DIR_MODE, FILE_MODE

# Instances built from a dotted path are cached: a stateful backend (InMemoryStorage) built
# afresh on every call would forget everything between two calls. Aliases are cached by
# Django's own `storages` handler, which also resets itself when STORAGES changes.
_cache: dict[tuple[str, str], Storage] = {}
_cache_lock = threading.Lock()


def get_memory_storage() -> Storage:
    spec: str = getattr(settings, "AGENT_MEMORY_STORAGE", "") or ""
    if spec and spec in storages.backends:
        return storages[spec]
    key = (spec, str(settings.RUNTIME_DIR))
    with _cache_lock:
        cached = _cache.get(key)
        if cached is None:
            cached = _cache[key] = _build(spec)
        return cached


def _build(spec: str) -> Storage:
    if not spec:
        # Private: the notes hold users' chat text (agentmemory.folders).
        return FileSystemStorage(
            location=settings.RUNTIME_DIR,
            file_permissions_mode=FILE_MODE,
            directory_permissions_mode=DIR_MODE,
        )
    try:
        target: Any = import_string(spec)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"AGENT_MEMORY_STORAGE={spec!r} is neither a STORAGES alias nor an importable path"
        ) from exc
    storage = target()
    if not isinstance(storage, Storage):
        raise ImproperlyConfigured(f"AGENT_MEMORY_STORAGE={spec!r} did not produce a Storage")
    return storage


@receiver(setting_changed)
def _reset_on_setting_change(*, setting: str, **kwargs: Any) -> None:
    # Tests (and only tests) change settings at runtime; without this a test pointing
    # RUNTIME_DIR at tmp_path would keep writing into the previous test's folder.
    if setting in {"AGENT_MEMORY_STORAGE", "RUNTIME_DIR", "STORAGES"}:
        with _cache_lock:
            _cache.clear()
        from agentmemory import index

        index.forget_all()
