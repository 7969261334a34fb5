"""Every agentmemory test gets its own RUNTIME_DIR under tmp_path and the default backend.

Store-level tests exercise files, not the database: `fake_agents` stands in for the agents'
rows (agent N's folder is the UUID whose integer is N), and `agent_dir` is where that folder
is, created through the store (with its owner marker) unless told otherwise."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agentmemory import folders
from agentmemory.storage import get_memory_storage


@pytest.fixture
def runtime(settings, tmp_path: Path) -> Path:
    root = tmp_path / "runtime"
    root.mkdir()
    settings.RUNTIME_DIR = root
    settings.AGENT_MEMORY_STORAGE = ""
    return root


def fake_row(agent_id: int) -> folders.AgentRow:
    return folders.AgentRow(memory_uuid=uuid.UUID(int=agent_id), owner_id=None)


def fake_root(agent_id: int) -> str:
    return str(uuid.UUID(int=agent_id))


@pytest.fixture
def fake_agents(monkeypatch):
    monkeypatch.setattr(folders, "agent_lookup", fake_row)


def agent_dir(runtime: Path, agent_id: int, *, create: bool = True) -> Path:
    if create:
        folders.agent_root(storage=get_memory_storage(), agent_id=agent_id, create=True)
    return runtime / fake_root(agent_id)
