"""The store against a non-filesystem backend, configured through AGENT_MEMORY_STORAGE: proves
every byte goes through the Storage API (nothing lands on disk) and the behaviour matches."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.files.storage import FileSystemStorage, InMemoryStorage

from agentmemory import store
from agentmemory.storage import get_memory_storage
from agentmemory.store import MemoryNotFound, TooLarge, UnsafeName
from tests.agentmemory.conftest import fake_root

pytestmark = pytest.mark.usefixtures("fake_agents")

A = 9
ROOT = fake_root(A)
MARKER = ".cadau-agent.json"
DAY = date(2025, 1, 2)


class RecordingStorage(InMemoryStorage):
    """InMemoryStorage that counts which Storage methods the store calls."""

    calls: Counter[str]

    def __init__(self) -> None:
        super().__init__()
        self.calls = Counter()

    def save(self, name, content, max_length=None):
        self.calls["save"] += 1
        return super().save(name, content, max_length=max_length)

    def open(self, name, mode="rb"):
        self.calls["open"] += 1
        return super().open(name, mode)

    def delete(self, name):
        self.calls["delete"] += 1
        return super().delete(name)

    def listdir(self, path):
        self.calls["listdir"] += 1
        return super().listdir(path)


@pytest.fixture
def memory_backend(settings, tmp_path: Path) -> InMemoryStorage:
    # RUNTIME_DIR points at a folder that must stay empty: the backend is not the filesystem.
    settings.RUNTIME_DIR = tmp_path / "must-stay-empty"
    settings.STORAGES = {
        **settings.STORAGES,
        "agent_memory_test": {"BACKEND": "django.core.files.storage.InMemoryStorage"},
    }
    settings.AGENT_MEMORY_STORAGE = "agent_memory_test"
    storage = get_memory_storage()
    assert isinstance(storage, InMemoryStorage)
    return storage


def _assert_nothing_on_disk(tmp_path: Path) -> None:
    assert not (tmp_path / "must-stay-empty").exists()


def test_alias_setting_selects_backend(memory_backend: InMemoryStorage):
    assert get_memory_storage() is memory_backend  # Django's storages handler caches it


def test_everything_goes_through_the_backend(memory_backend: InMemoryStorage, tmp_path: Path):
    store.daily_note_append(agent_id=A, day=DAY, heading="Archive", body="one")
    store.daily_note_append(agent_id=A, day=DAY, heading="Archive", body="two")
    assert store.daily_note_read(agent_id=A, day=DAY) == (
        "# 2025-01-02\n\n## Archive\n\none\n\n## Archive\n\ntwo\n"
    )
    assert store.daily_note_list(agent_id=A) == [DAY]

    first = store.entry_write(agent_id=A, name=None, content="User likes green tea", tags=["t"])
    dup = store.entry_write(agent_id=A, name=None, content="user likes green tea!")
    other = store.entry_write(agent_id=A, name="city", content="用户住在上海")
    assert first.created and not dup.created and other.created
    assert [e.name for e in store.entry_list(agent_id=A)] == ["city", "user-likes-green-tea"]
    assert store.entry_read(agent_id=A, name="city").content == "用户住在上海"
    assert store.entry_search(agent_id=A, query="上海", limit=5)[0][1].name == "city"
    assert store.entries_for_prompt(agent_id=A, query="tea", max_runes=1000) == (
        "- user likes green tea!\n- 用户住在上海"
    )
    assert store.entry_delete(agent_id=A, name="city") is True
    assert store.entry_delete(agent_id=A, name="city") is False

    store.workspace_write(agent_id=A, path="notes/todo.md", content="- [ ] ship")
    store.workspace_write(agent_id=A, path="notes/todo.md", content="- [x] ship")
    store.workspace_write(agent_id=A, path="readme.txt", content="hi")
    assert store.workspace_read(agent_id=A, path="notes/todo.md") == "- [x] ship"
    assert store.workspace_list(agent_id=A) == ["notes/todo.md", "readme.txt"]

    # The files are where the layout says, inside the backend, with no renamed copies.
    assert memory_backend.listdir(ROOT) == (["memory", "workspace"], [MARKER])
    assert memory_backend.listdir(f"{ROOT}/memory") == (["entries"], ["2025-01-02.md"])
    assert memory_backend.listdir(f"{ROOT}/memory/entries") == ([], ["user-likes-green-tea.md"])
    assert memory_backend.listdir(f"{ROOT}/workspace/notes") == ([], ["todo.md"])
    _assert_nothing_on_disk(tmp_path)


def test_errors_are_the_same(memory_backend: InMemoryStorage, tmp_path: Path):
    with pytest.raises(MemoryNotFound):
        store.entry_read(agent_id=A, name="missing")
    with pytest.raises(MemoryNotFound):
        store.workspace_read(agent_id=A, path="missing.txt")
    with pytest.raises(UnsafeName):
        store.workspace_write(agent_id=A, path="../x", content="x")
    with pytest.raises(TooLarge):
        store.workspace_write(
            agent_id=A, path="big.txt", content="x" * (store.WORKSPACE_MAX_BYTES + 1)
        )
    assert store.daily_note_read(agent_id=A, day=DAY) == ""
    _assert_nothing_on_disk(tmp_path)


def test_dotted_path_setting_and_recorded_calls(settings, tmp_path: Path):
    settings.RUNTIME_DIR = tmp_path / "must-stay-empty"
    settings.AGENT_MEMORY_STORAGE = "tests.agentmemory.test_storage_backend.RecordingStorage"
    storage = get_memory_storage()
    assert isinstance(storage, RecordingStorage)
    assert get_memory_storage() is storage  # cached, or an in-memory store would forget
    store.entry_write(agent_id=A, name="x", content="a fact")
    store.entry_read(agent_id=A, name="x")
    store.entry_list(agent_id=A)
    store.workspace_write(agent_id=A, path="f.txt", content="1")
    store.workspace_write(agent_id=A, path="f.txt", content="2")  # replace = delete + save
    assert store.workspace_read(agent_id=A, path="f.txt") == "2"
    assert storage.calls["save"] == 4  # the owner marker, the entry, the file twice
    assert storage.calls["delete"] == 1
    assert storage.calls["open"] >= 2 and storage.calls["listdir"] >= 2
    _assert_nothing_on_disk(tmp_path)


def test_threads_appending_on_a_non_filesystem_backend(memory_backend: InMemoryStorage):
    # In-process serialisation is what this backend gets (see store docstring); check it holds.
    barrier = threading.Barrier(8)

    def work(w: int) -> None:
        barrier.wait()
        for i in range(10):
            store.daily_note_append(agent_id=A, day=DAY, heading=f"w{w}-{i}", body=f"body {w}-{i}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, range(8)))
    text = store.daily_note_read(agent_id=A, day=DAY)
    for w in range(8):
        for i in range(10):
            assert text.count(f"## w{w}-{i}\n\nbody {w}-{i}\n") == 1
    assert memory_backend.listdir(f"{ROOT}/memory") == ([], ["2025-01-02.md"])


def test_default_is_filesystem_at_runtime_dir(settings, tmp_path: Path):
    settings.RUNTIME_DIR = tmp_path
    settings.AGENT_MEMORY_STORAGE = ""
    storage = get_memory_storage()
    assert isinstance(storage, FileSystemStorage)
    assert Path(storage.location) == tmp_path


@pytest.mark.parametrize("spec", ["no-such-alias", "no.such.module.Storage", "os.getcwd"])
def test_bad_setting_is_improperly_configured(settings, spec: str):
    settings.AGENT_MEMORY_STORAGE = spec
    with pytest.raises(ImproperlyConfigured):
        get_memory_storage()
