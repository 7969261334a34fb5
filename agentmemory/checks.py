"""System check for AGENT_MEMORY_STORAGE (see chat/checks.py for why such settings are checked
at start): a path that does not import, or does not give a Storage, failed every memory write
and flush at first use."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured


def memory_storage_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from agentmemory.storage import get_memory_storage

    try:
        get_memory_storage()
    except (ImproperlyConfigured, ImportError, TypeError, ValueError) as exc:
        return [
            checks.Error(
                str(exc),
                hint="AGENT_MEMORY_STORAGE is empty (files under RUNTIME_DIR), a STORAGES "
                "alias, or the dotted path of a Storage class.",
                id="cadau.E002",
            )
        ]
    return []
