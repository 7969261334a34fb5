"""Agent memory on disk: folders named by the agent's random UUID with an owner marker, private
modes, per-agent caps, the migration that renames existing folders, and the entries cache that
keeps memory lookup flat."""

from __future__ import annotations

import importlib
import json
import os
import stat
import uuid
from datetime import date
from pathlib import Path

import pytest
from django.apps import apps as django_apps

from agentmemory import folders, index, store
from chat.tools import ToolContext, ToolError
from tests.factories import AgentFactory, UserFactory

pytestmark = pytest.mark.django_db
DAY = date(2025, 5, 1)


@pytest.fixture
def agent(runtime, owner):
    return AgentFactory(owner=owner)


def _folder(runtime: Path, agent) -> Path:
    return runtime / str(agent.memory_uuid)


# --- folders keyed by a random UUID, with an owner marker --------------------------------------


def test_folder_is_named_by_the_agents_uuid_and_marked(runtime, agent):
    store.entry_write(agent_id=agent.pk, name="tea", content="Likes green tea")
    folder = _folder(runtime, agent)
    assert (folder / "memory" / "entries" / "tea.md").is_file()
    marker = json.loads((folder / folders.MARKER_NAME).read_text())
    assert marker == {
        "agent_uuid": str(agent.memory_uuid),
        "agent_id": agent.pk,
        "owner_id": agent.owner_id,
    }
    assert not (runtime / str(agent.pk)).exists()
    assert isinstance(agent.memory_uuid, uuid.UUID) and agent.memory_uuid.version == 4


def test_a_previous_databases_folder_with_the_same_id_is_not_read(runtime, owner):
    # The review's finding: same RUNTIME_DIR, fresh database, the new agent 1 read the old
    # agent 1's notes. The old layout named folders by id; plant one for the new agent's id.
    newcomer = AgentFactory(owner=UserFactory(username="newcomer"))
    old = runtime / str(newcomer.pk) / "memory"
    (old / "entries").mkdir(parents=True)
    (old / "entries" / "secret.md").write_text("The previous owner's secret")
    (old / "2025-05-01.md").write_text("# 2025-05-01\n\nprevious owner's chat text\n")
    assert store.entry_list(agent_id=newcomer.pk) == []
    assert store.daily_note_read(agent_id=newcomer.pk, day=DAY) == ""
    assert store.entries_for_prompt(agent_id=newcomer.pk, query="secret", max_runes=999) == ""
    # And a previous database's agent with a UUID folder: a new agent gets another UUID.
    other = AgentFactory(owner=newcomer.owner)
    assert other.memory_uuid != newcomer.memory_uuid


def test_a_folder_without_the_marker_is_refused(runtime, agent, api):
    folder = _folder(runtime, agent)
    (folder / "memory" / "entries").mkdir(parents=True)
    (folder / "memory" / "entries" / "planted.md").write_text("not this agent's")
    with pytest.raises(folders.FolderNotOwned):
        store.entry_list(agent_id=agent.pk)
    with pytest.raises(folders.FolderNotOwned):
        store.entry_write(agent_id=agent.pk, name=None, content="a new fact")
    with pytest.raises(folders.FolderNotOwned):
        store.daily_note_append(agent_id=agent.pk, day=DAY, heading="h", body="b")
    response = api.get(f"/api/v1/agents/{agent.pk}/memory/entries")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "memory_folder_not_owned"
    assert str(agent.memory_uuid) not in response.content.decode()
    assert sorted(p.name for p in (folder / "memory" / "entries").iterdir()) == ["planted.md"]


def test_a_marker_naming_another_agent_is_refused(runtime, agent):
    folder = _folder(runtime, agent)
    folder.mkdir()
    (folder / folders.MARKER_NAME).write_text(json.dumps({"agent_uuid": str(uuid.uuid4())}))
    with pytest.raises(folders.FolderNotOwned):
        store.workspace_list(agent_id=agent.pk)
    (folder / folders.MARKER_NAME).write_text("not json")
    with pytest.raises(folders.FolderNotOwned):
        store.workspace_write(agent_id=agent.pk, path="a.txt", content="x")


def test_the_memory_hook_survives_a_refused_folder(runtime, agent):
    from chat.models import ChatSession
    from tests.helpers import memory_system_prompt

    session = ChatSession.objects.create(owner=agent.owner, agent=agent)
    (_folder(runtime, agent) / "memory").mkdir(parents=True)
    assert memory_system_prompt(session=session, query="x") == ""


def test_no_agent_means_nothing_to_read_and_nothing_written(runtime):
    assert store.entry_list(agent_id=987654) == []
    with pytest.raises(folders.AgentMissing):
        store.entry_write(agent_id=987654, name=None, content="orphan fact")
    assert list(runtime.iterdir()) == []


# --- private modes -----------------------------------------------------------------------------


def test_files_are_0600_and_folders_0700(runtime, agent):
    old_umask = os.umask(0o022)  # a typical umask, which would leave 0644/0755
    try:
        store.entry_write(agent_id=agent.pk, name="tea", content="Likes green tea")
        store.daily_note_append(agent_id=agent.pk, day=DAY, heading="h", body="b")
        store.workspace_write(agent_id=agent.pk, path="a/b/c.txt", content="deep")
    finally:
        os.umask(old_umask)
    folder = _folder(runtime, agent)
    seen = 0
    for base, _dirs, files in os.walk(folder):
        assert stat.S_IMODE(os.stat(base).st_mode) == 0o700, base
        for name in files:
            mode = stat.S_IMODE(os.stat(os.path.join(base, name)).st_mode)
            assert mode == 0o600, (base, name, oct(mode))
            seen += 1
    assert seen >= 5  # marker, entry, its lock, note, its lock, workspace file


# --- caps --------------------------------------------------------------------------------------


def test_entries_are_capped_per_agent(runtime, agent, settings, api):
    settings.AGENT_MEMORY_MAX_ENTRIES = 3
    for fact in ["Likes green tea", "Lives in Lisbon", "Works on Cadau"]:
        store.entry_write(agent_id=agent.pk, name=None, content=fact)
    with pytest.raises(store.MemoryFull, match="AGENT_MEMORY_MAX_ENTRIES"):
        store.entry_write(agent_id=agent.pk, name=None, content="Plays the cello")
    # Updating (by name or as a near-duplicate) is still fine when full.
    assert not store.entry_write(agent_id=agent.pk, name=None, content="likes green tea!").created
    response = api.post(
        f"/api/v1/agents/{agent.pk}/memory/entries", {"content": "Has a cat"}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "memory_full"
    assert len(store.entry_list(agent_id=agent.pk)) == 3


def test_workspace_files_are_capped_per_agent(runtime, agent, settings):
    from agentmemory.tools import _guarded, _workspace_write

    settings.AGENT_WORKSPACE_MAX_FILES = 2
    store.workspace_write(agent_id=agent.pk, path="a.txt", content="1")
    store.workspace_write(agent_id=agent.pk, path="dir/b.txt", content="2")
    with pytest.raises(store.MemoryFull, match="AGENT_WORKSPACE_MAX_FILES"):
        store.workspace_write(agent_id=agent.pk, path="c.txt", content="3")
    store.workspace_write(agent_id=agent.pk, path="a.txt", content="overwrite is fine")
    context = ToolContext(agent_id=agent.pk, session_id=1, user_id=agent.owner_id)
    with pytest.raises(ToolError, match="workspace is full"):
        _guarded(_workspace_write)(context, {"path": "d.txt", "content": "4"})


# --- the entries cache -------------------------------------------------------------------------


@pytest.fixture
def reads(monkeypatch):
    """Counts entry files read and parsed."""
    counted = {"n": 0}
    original = index.load_entry

    def counting(**kwargs):
        counted["n"] += 1
        return original(**kwargs)

    monkeypatch.setattr(index, "load_entry", counting)
    return counted


def test_lookups_read_only_what_changed(runtime, agent, reads):
    for n in range(30):
        store.entry_write(agent_id=agent.pk, name=f"fact-{n}", content=f"Fact number {n} about tea")
    first = store.entries_for_prompt(agent_id=agent.pk, query="tea", max_runes=500)
    reads["n"] = 0
    # Nothing changed: no file is read again, whatever is asked.
    assert store.entries_for_prompt(agent_id=agent.pk, query="tea", max_runes=500) == first
    store.entry_search(agent_id=agent.pk, query="fact 7", limit=3)
    store.entry_list(agent_id=agent.pk)
    assert reads["n"] == 0
    # One entry rewritten through the store: that file alone is read again.
    store.entry_write(agent_id=agent.pk, name="fact-3", content="Fact three now about coffee")
    reads["n"] = 0
    hits = store.entry_search(agent_id=agent.pk, query="coffee", limit=3)
    assert [e.name for _, e in hits] == ["fact-3"]
    assert reads["n"] == 1


def test_hand_edits_and_deletions_are_seen(runtime, agent, monkeypatch):
    store.entry_write(agent_id=agent.pk, name="city", content="Lives in Lisbon")
    store.entry_write(agent_id=agent.pk, name="drink", content="Likes green tea")
    assert "Lisbon" in store.entries_for_prompt(agent_id=agent.pk, query="", max_runes=500)
    entries = _folder(runtime, agent) / "memory" / "entries"
    # A file removed (or added, or replaced by rename) changes the folder: seen at once.
    (entries / "drink.md").unlink()
    listing = store.entries_for_prompt(agent_id=agent.pk, query="", max_runes=500)
    assert listing == "- Lives in Lisbon"
    # Edited in place (same inode), as `echo >>` or an editor without rename would: seen at
    # the next scan of the files, RESCAN_SECONDS at most later.
    with open(entries / "city.md", "r+") as handle:
        text = handle.read().replace("Lisbon", "Porto")
        handle.seek(0)
        handle.write(text)
        handle.truncate()
    os.utime(entries / "city.md", ns=(1, 1))
    monkeypatch.setattr(index, "RESCAN_SECONDS", 0.0)
    listing = store.entries_for_prompt(agent_id=agent.pk, query="", max_runes=500)
    assert listing == "- Lives in Porto"


def test_cached_results_equal_a_fresh_read(runtime, agent):
    facts = ["用户喜欢喝绿茶", "The user likes green tea", "Meeting every Monday", "喝茶 at 4pm"]
    for fact in facts:
        store.entry_write(agent_id=agent.pk, name=None, content=fact, tags=["t"])
    warm = store.entries_for_prompt(agent_id=agent.pk, query="喝茶 tea", max_runes=60)
    search = store.entry_search(agent_id=agent.pk, query="喝茶 tea", limit=4)
    index.forget_all()
    assert store.entries_for_prompt(agent_id=agent.pk, query="喝茶 tea", max_runes=60) == warm
    assert store.entry_search(agent_id=agent.pk, query="喝茶 tea", limit=4) == search


# --- the migration -----------------------------------------------------------------------------


def test_migration_renames_id_folders_and_marks_them(runtime, owner):
    migration = importlib.import_module("chat.migrations.0004_agent_memory_uuid")
    kept = AgentFactory(owner=owner)
    fresh = AgentFactory(owner=owner)
    old = runtime / str(kept.pk) / "memory" / "entries"
    old.mkdir(parents=True)
    (old / "tea.md").write_text("Likes green tea")
    orphan = runtime / "424242"
    (orphan / "memory").mkdir(parents=True)

    migration.forwards(django_apps, None)

    kept.refresh_from_db()
    fresh.refresh_from_db()
    assert not (runtime / str(kept.pk)).exists()
    assert [e.content for e in store.entry_list(agent_id=kept.pk)] == ["Likes green tea"]
    assert store.entry_list(agent_id=fresh.pk) == []
    assert orphan.is_dir()  # no agent of this database: left alone, and nobody reads it

    migration.backwards(django_apps, None)
    assert (runtime / str(kept.pk) / "memory" / "entries" / "tea.md").is_file()
    assert not (runtime / str(kept.pk) / folders.MARKER_NAME).exists()


@pytest.mark.parametrize(
    ("name", "value"),
    [("AGENT_MEMORY_MAX_ENTRIES", "0"), ("AGENT_WORKSPACE_MAX_FILES", "many")],
)
def test_bad_caps_stop_start_up(name, value):
    import subprocess
    import sys

    from tests.test_https import _child_env

    done = subprocess.run(
        [sys.executable, "-c", "import cadau.settings"],
        env=_child_env({name: value}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and f"ImproperlyConfigured: {name}" in done.stderr
