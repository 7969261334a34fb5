"""Every agentmemory test gets its own RUNTIME_DIR under tmp_path and the default backend."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def runtime(settings, tmp_path: Path) -> Path:
    root = tmp_path / "runtime"
    root.mkdir()
    settings.RUNTIME_DIR = root
    settings.AGENT_MEMORY_STORAGE = ""
    return root
