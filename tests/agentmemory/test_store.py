"""The store's behaviour on the default (filesystem) backend."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from agentmemory import fileio, store
from agentmemory.store import MemoryEntry, MemoryNotFound, TooLarge, UnsafeName
from tests.agentmemory.conftest import agent_dir

pytestmark = pytest.mark.usefixtures("fake_agents")

A = 3
DAY = date(2025, 3, 14)


# --- daily notes ---------------------------------------------------------------------------


def test_daily_note_missing_reads_empty(runtime: Path):
    assert store.daily_note_read(agent_id=A, day=DAY) == ""
    assert store.daily_note_list(agent_id=A) == []


def test_daily_note_append_creates_titled_note_and_appends_blocks(runtime: Path):
    store.daily_note_append(
        agent_id=A, day=DAY, heading="Context compaction archive", body="user: hi\n"
    )
    store.daily_note_append(agent_id=A, day=DAY, heading="Turn", body="assistant: hello")
    text = store.daily_note_read(agent_id=A, day=DAY)
    assert text == (
        "# 2025-03-14\n\n## Context compaction archive\n\nuser: hi\n\n## Turn\n\nassistant: hello\n"
    )
    assert (agent_dir(runtime, 3) / "memory" / "2025-03-14.md").read_text() == text
    assert store.daily_note_list(agent_id=A) == [DAY]


def test_daily_note_heading_cannot_inject_lines(runtime: Path):
    store.daily_note_append(agent_id=A, day=DAY, heading="a\n## fake\r\nb", body="x")
    assert "## a ## fake b\n" in store.daily_note_read(agent_id=A, day=DAY)
    store.daily_note_append(agent_id=A, day=DAY, heading="  ", body="y")
    assert "## Note\n\ny\n" in store.daily_note_read(agent_id=A, day=DAY)


def test_daily_note_append_after_hand_edit_without_final_newline(runtime: Path):
    note = agent_dir(runtime, 3) / "memory" / "2025-03-14.md"
    note.parent.mkdir(parents=True)
    note.write_text("my own notes")
    store.daily_note_append(agent_id=A, day=DAY, heading="h", body="b")
    assert note.read_text() == "my own notes\n\n## h\n\nb\n"


def test_daily_note_list_ignores_other_files(runtime: Path):
    memory = agent_dir(runtime, 3) / "memory"
    memory.mkdir(parents=True)
    for name in ("2025-01-01.md", "2025-02-30.md", "notes.md", ".2025-01-01.md.lock"):
        (memory / name).write_text("x")
    store.daily_note_append(agent_id=A, day=DAY, heading="h", body="b")
    assert store.daily_note_list(agent_id=A) == [DAY, date(2025, 1, 1)]


def test_daily_note_block_cap(runtime: Path):
    with pytest.raises(TooLarge):
        store.daily_note_append(
            agent_id=A, day=DAY, heading="h", body="x" * (store.DAILY_APPEND_MAX_BYTES + 1)
        )


# --- entries CRUD --------------------------------------------------------------------------


def test_entry_write_read_list_delete(runtime: Path):
    result = store.entry_write(
        agent_id=A,
        name=None,
        content="  The user's name is Ada Lovelace.\nShe prefers tea.  ",
        source_session_id=11,
        source_message_id=42,
        tags=["Profile", "profile", "bad,tag", " people "],
    )
    assert result.created
    entry = result.entry
    assert entry.name == "the-user-s-name-is-ada-lovelace"
    assert entry.content == "The user's name is Ada Lovelace.\nShe prefers tea."
    assert (entry.source_session_id, entry.source_message_id) == (11, 42)
    assert entry.tags == ("profile", "people")
    assert entry.created == entry.updated and entry.created.tzinfo is not None
    assert store.entry_read(agent_id=A, name=entry.name) == entry
    assert store.entry_read(agent_id=A, name=f"{entry.name}.md") == entry
    assert store.entry_list(agent_id=A) == [entry]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.content = "changed"  # type: ignore[misc]
    assert store.entry_delete(agent_id=A, name=entry.name) is True
    assert store.entry_delete(agent_id=A, name=entry.name) is False
    with pytest.raises(MemoryNotFound):
        store.entry_read(agent_id=A, name=entry.name)
    assert store.entry_list(agent_id=A) == []


def test_entry_file_format(runtime: Path):
    entry = store.entry_write(
        agent_id=A, name="tea", content="Likes tea", source_session_id=1, tags=["x"]
    ).entry
    text = (agent_dir(runtime, 3) / "memory" / "entries" / "tea.md").read_text()
    assert text == (
        "---\n"
        f"created: {entry.created.isoformat(timespec='microseconds')}\n"
        f"updated: {entry.updated.isoformat(timespec='microseconds')}\n"
        "source_session_id: 1\n"
        "tags: [x]\n"
        "---\n"
        "Likes tea\n"
    )


def test_entry_explicit_name_updates_in_place(runtime: Path):
    first = store.entry_write(
        agent_id=A, name="stack", content="Backend is Django", source_session_id=5, tags=["t"]
    )
    second = store.entry_write(agent_id=A, name="stack.md", content="Backend is Django 5.2")
    assert first.created and not second.created
    assert second.entry.name == "stack"
    assert second.entry.content == "Backend is Django 5.2"
    assert second.entry.created == first.entry.created
    assert second.entry.updated > first.entry.updated
    assert second.entry.source_session_id == 5 and second.entry.tags == ("t",)
    assert len(store.entry_list(agent_id=A)) == 1


def test_entry_list_newest_updated_first(runtime: Path):
    for text in ("Alpha fact one", "Beta fact two", "Gamma fact three"):
        store.entry_write(agent_id=A, name=None, content=text)
    store.entry_write(agent_id=A, name="alpha-fact-one", content="Alpha fact one, revised")
    names = [e.name for e in store.entry_list(agent_id=A)]
    assert names == ["alpha-fact-one", "gamma-fact-three", "beta-fact-two"]


def test_entry_slug_collision_and_non_ascii_first_line(runtime: Path):
    a = store.entry_write(agent_id=A, name=None, content="Deadline\nThe report is due Friday")
    b = store.entry_write(agent_id=A, name=None, content="Deadline\nInvoices go out Monday")
    c = store.entry_write(agent_id=A, name=None, content="用户住在上海")
    assert (a.entry.name, b.entry.name) == ("deadline", "deadline-2")
    assert c.entry.name.startswith("entry-") and len(c.entry.name) == len("entry-") + 12


def test_entry_validation(runtime: Path):
    for content in ("", "   ", "...!!!", "+++", "~~~", "="):
        with pytest.raises(ValueError, match="empty"):
            store.entry_write(agent_id=A, name=None, content=content)
    with pytest.raises(TooLarge):
        store.entry_write(agent_id=A, name=None, content="x" * (store.ENTRY_MAX_CHARS + 1))
    with pytest.raises(UnsafeName):
        store.entry_write(agent_id=A, name="../escape", content="x")
    with pytest.raises(ValueError):
        store.entry_write(agent_id=A, name=None, content="x", source_session_id=0)
    with pytest.raises(ValueError):
        store.entry_write(agent_id=A, name=None, content="x", source_message_id=True)
    assert not (agent_dir(runtime, 3) / "memory" / "entries").exists() or not store.entry_list(
        agent_id=A
    )


def test_agents_are_isolated(runtime: Path):
    store.entry_write(agent_id=1, name="secret", content="agent one only")
    assert store.entry_list(agent_id=2) == []
    with pytest.raises(MemoryNotFound):
        store.entry_read(agent_id=2, name="secret")


# --- dedup ---------------------------------------------------------------------------------


def test_an_entry_of_emoji_is_kept_and_told_apart_from_others(runtime: Path):
    # Refused as "empty" before: its words were none.
    nuts = store.entry_write(agent_id=A, name=None, content="🥜🚫")
    cake = store.entry_write(agent_id=A, name=None, content="🎂 = 🍫")
    assert nuts.created and cake.created and nuts.entry.name != cake.entry.name
    again = store.entry_write(agent_id=A, name=None, content=" 🥜 🚫\ufe0f ")
    assert not again.created and again.entry.name == nuts.entry.name
    assert len(store.entry_list(agent_id=A)) == 2


def test_exact_duplicate_after_normalisation_updates(runtime: Path):
    first = store.entry_write(
        agent_id=A, name=None, content="User likes green tea.", source_session_id=1, tags=["a"]
    )
    again = store.entry_write(
        agent_id=A,
        name=None,
        content="  user LIKES   green tea!! ",
        source_session_id=9,
        tags=["b"],
    )
    assert not again.created
    assert again.entry.name == first.entry.name
    assert again.entry.content == "user LIKES   green tea!!"  # newest wording wins
    assert again.entry.source_session_id == 1  # provenance: where the fact first came from
    assert again.entry.tags == ("a", "b")
    assert again.entry.created == first.entry.created
    assert len(store.entry_list(agent_id=A)) == 1


def test_near_duplicate_updates_and_distinct_fact_creates(runtime: Path):
    base = "The production database is PostgreSQL 16 on the host db1 in Frankfurt"
    store.entry_write(agent_id=A, name=None, content=base)
    near = store.entry_write(
        agent_id=A,
        name=None,
        content="The production database is PostgreSQL 16 on host db1 in Frankfurt now",
    )
    assert not near.created
    other = store.entry_write(agent_id=A, name=None, content="The staging database is SQLite")
    assert other.created
    assert len(store.entry_list(agent_id=A)) == 2


def test_near_duplicate_in_chinese(runtime: Path):
    store.entry_write(agent_id=A, name=None, content="用户喜欢喝绿茶，不喝咖啡。")
    again = store.entry_write(agent_id=A, name=None, content="用户喜欢喝绿茶,不喝咖啡")
    assert not again.created
    assert len(store.entry_list(agent_id=A)) == 1


def test_dedup_applies_to_a_new_explicit_name_too(runtime: Path):
    store.entry_write(agent_id=A, name="tea", content="Likes green tea")
    result = store.entry_write(agent_id=A, name="drinks", content="likes green tea.")
    assert not result.created and result.entry.name == "tea"


# --- search & prompt -----------------------------------------------------------------------


@pytest.fixture
def corpus(runtime: Path) -> None:
    for text, tags in (
        ("The user's cat is called Miso and is allergic to fish", ["pets"]),
        ("Deploys happen on Tuesdays through the CI pipeline", ["ops"]),
        ("The user prefers short answers without emojis", ["style"]),
        ("Cat food brand: the user buys Acme cat food, cat treats on Fridays", []),
        ("用户住在上海，喜欢喝绿茶", ["profile"]),
        ("项目截止日期是下周五", []),
    ):
        store.entry_write(agent_id=A, name=None, content=text, tags=tags)


def test_search_ranks_by_relevance(corpus: None):
    results = store.entry_search(agent_id=A, query="cat", limit=10)
    assert [e.name for _, e in results] == [
        "cat-food-brand-the-user-buys-acme-cat-food-cat-treats-on",
        "the-user-s-cat-is-called-miso-and-is-allergic-to-fish",
    ]
    assert results[0][0] > results[1][0] > 0
    assert store.entry_search(agent_id=A, query="cat", limit=1)[0][1].name.startswith("cat-")
    assert store.entry_search(agent_id=A, query="nothing-matches-this", limit=5) == []
    assert store.entry_search(agent_id=A, query="", limit=5) == []
    assert store.entry_search(agent_id=A, query="cat", limit=0) == []


def test_search_matches_tags_and_is_case_insensitive(corpus: None):
    assert [e.content for _, e in store.entry_search(agent_id=A, query="OPS", limit=3)] == [
        "Deploys happen on Tuesdays through the CI pipeline"
    ]


def test_search_chinese(corpus: None):
    top = store.entry_search(agent_id=A, query="绿茶", limit=3)
    assert top[0][1].content == "用户住在上海，喜欢喝绿茶"
    assert len(top) == 1
    deadline = store.entry_search(agent_id=A, query="截止日期是什么时候？", limit=3)
    assert deadline[0][1].content == "项目截止日期是下周五"
    # Mixed-script queries work too.
    assert store.entry_search(agent_id=A, query="用户 cat", limit=10)


def test_entries_for_prompt_relevant_first_then_newest_within_cap(corpus: None):
    full = store.entries_for_prompt(agent_id=A, query="deploys", max_runes=100_000)
    lines = full.split("\n")
    assert lines[0] == "- Deploys happen on Tuesdays through the CI pipeline"
    assert lines[1] == "- 项目截止日期是下周五"  # newest of the rest
    assert len(lines) == 6
    for cap in (0, 10, 60, 120, 200):
        text = store.entries_for_prompt(agent_id=A, query="deploys", max_runes=cap)
        assert len(text) <= cap
    first, second = lines[0], lines[1]
    exact = len(first) + 1 + len(second)
    assert store.entries_for_prompt(agent_id=A, query="deploys", max_runes=exact) == (
        f"{first}\n{second}"
    )
    assert store.entries_for_prompt(agent_id=A, query="deploys", max_runes=exact - 1) == first


def test_entries_for_prompt_skips_what_does_not_fit(runtime: Path):
    store.entry_write(agent_id=A, name="small", content="small fact")
    store.entry_write(agent_id=A, name="big", content="big " * 100)
    assert store.entries_for_prompt(agent_id=A, query="", max_runes=50) == "- small fact"


def test_entries_for_prompt_multiline_and_empty(runtime: Path):
    assert store.entries_for_prompt(agent_id=A, query="x", max_runes=1000) == ""
    store.entry_write(agent_id=A, name="multi", content="Line one\n\nline two")
    assert store.entries_for_prompt(agent_id=A, query="", max_runes=1000) == (
        "- Line one\n  line two"
    )


# --- broken / hand-edited files ------------------------------------------------------------


def _entry_file(runtime: Path, name: str, text: str) -> None:
    entries = agent_dir(runtime, 3) / "memory" / "entries"
    entries.mkdir(parents=True, exist_ok=True)
    (entries / name).write_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "No front matter at all.\nJust a fact.",
        "---\ncreated: 2025-01-01T00:00:00+00:00\nNo closing fence, a fact",
        "---\nthis is not a key value line\n---\nbody",
        "---\n---",
        "",
    ],
)
def test_broken_front_matter_still_reads_with_content_preserved(runtime: Path, text: str):
    _entry_file(runtime, "hand.md", text)
    entry = store.entry_read(agent_id=A, name="hand")
    assert entry.content == text.strip() or (text == "---\n---" and entry.content == "")
    assert entry.created.tzinfo is not None and entry.updated.tzinfo is not None
    assert [e.name for e in store.entry_list(agent_id=A)] == ["hand"]


def test_bad_field_values_fall_back(runtime: Path):
    _entry_file(
        runtime,
        "odd.md",
        "---\ncreated: yesterday\nupdated: 2025-02-03\nsource_session_id: -4\n"
        "source_message_id: abc\ntags: pets, , Cats\nextra: ignored\n---\n\nThe fact.\n",
    )
    entry = store.entry_read(agent_id=A, name="odd")
    assert entry == MemoryEntry(
        name="odd",
        content="The fact.",
        created=datetime(2025, 2, 3, tzinfo=UTC),
        updated=datetime(2025, 2, 3, tzinfo=UTC),
        source_session_id=None,
        source_message_id=None,
        tags=("pets", "cats"),
    )


def test_body_may_contain_fences_and_crlf(runtime: Path):
    store.entry_write(agent_id=A, name="md", content="Title\n\n---\n\nafter a rule")
    assert store.entry_read(agent_id=A, name="md").content == "Title\n\n---\n\nafter a rule"
    _entry_file(runtime, "crlf.md", "---\r\ntags: [a]\r\n---\r\nwindows fact\r\n")
    entry = store.entry_read(agent_id=A, name="crlf")
    assert entry.tags == ("a",) and entry.content == "windows fact"


def test_invalid_utf8_and_stray_files(runtime: Path):
    entries = agent_dir(runtime, 3) / "memory" / "entries"
    entries.mkdir(parents=True)
    (entries / "bin.md").write_bytes(b"caf\xe9 fact")
    for stray in ("Upper.md", "notes.txt", ".entries.lock", ".x.md.abc.tmp", "a.b.md"):
        (entries / stray).write_text("x")
    (entries / "folder.md").mkdir()
    assert [e.name for e in store.entry_list(agent_id=A)] == ["bin"]
    assert store.entry_read(agent_id=A, name="bin").content == "caf\ufffd fact"


def test_hand_edited_entry_is_rewritten_cleanly_on_update(runtime: Path):
    _entry_file(runtime, "hand.md", "Some fact written by a person")
    result = store.entry_write(agent_id=A, name="hand", content="Some fact, corrected")
    assert not result.created
    assert store.entry_read(agent_id=A, name="hand").content == "Some fact, corrected"


# --- workspace -----------------------------------------------------------------------------


def test_workspace_write_read_list(runtime: Path):
    store.workspace_write(agent_id=A, path="plan.md", content="# Plan\n")
    store.workspace_write(agent_id=A, path="src/app/main.py", content="print('hi')\n")
    store.workspace_write(agent_id=A, path="plan.md", content="# Plan v2\n")
    assert store.workspace_read(agent_id=A, path="plan.md") == "# Plan v2\n"
    assert store.workspace_list(agent_id=A) == ["plan.md", "src/app/main.py"]
    assert (agent_dir(runtime, 3) / "workspace" / "src" / "app" / "main.py").is_file()
    # No temp or lock files left behind.
    assert sorted(p.name for p in (agent_dir(runtime, 3) / "workspace").iterdir()) == [
        "plan.md",
        "src",
    ]


def test_workspace_missing_and_unsafe(runtime: Path):
    assert store.workspace_list(agent_id=A) == []
    with pytest.raises(MemoryNotFound):
        store.workspace_read(agent_id=A, path="nope.txt")
    for bad in ("../x", "/abs", "a\\b", ".env", "a/%2e%2e/b"):
        with pytest.raises(UnsafeName):
            store.workspace_write(agent_id=A, path=bad, content="x")
        with pytest.raises(UnsafeName):
            store.workspace_read(agent_id=A, path=bad)


def test_workspace_size_caps(runtime: Path):
    cap = store.WORKSPACE_MAX_BYTES
    store.workspace_write(agent_id=A, path="max.txt", content="x" * cap)
    assert len(store.workspace_read(agent_id=A, path="max.txt")) == cap
    with pytest.raises(TooLarge):
        store.workspace_write(agent_id=A, path="big.txt", content="x" * (cap + 1))
    with pytest.raises(TooLarge):  # multi-byte characters count as bytes
        store.workspace_write(agent_id=A, path="big.txt", content="字" * (cap // 3 + 1))
    (agent_dir(runtime, 3) / "workspace" / "huge.txt").write_bytes(b"y" * (cap + 1))
    with pytest.raises(TooLarge):
        store.workspace_read(agent_id=A, path="huge.txt")


def test_workspace_file_folder_conflicts(runtime: Path):
    store.workspace_write(agent_id=A, path="a", content="file")
    with pytest.raises(UnsafeName):
        store.workspace_write(agent_id=A, path="a/b.txt", content="x")
    store.workspace_write(agent_id=A, path="dir/x.txt", content="x")
    with pytest.raises(UnsafeName):
        store.workspace_write(agent_id=A, path="dir", content="x")
    with pytest.raises(MemoryNotFound):
        store.workspace_read(agent_id=A, path="dir")


def test_workspace_list_hides_unlistable_names(runtime: Path):
    workspace = agent_dir(runtime, 3) / "workspace"
    workspace.mkdir(parents=True)
    (workspace / ".hidden").write_text("x")
    (workspace / "bad name.txt").write_text("x")
    (workspace / "ok.txt").write_text("x")
    assert store.workspace_list(agent_id=A) == ["ok.txt"]


def test_atomic_write_failure_keeps_old_content(runtime: Path, monkeypatch):
    store.workspace_write(agent_id=A, path="doc.txt", content="old")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as patched, pytest.raises(OSError, match="disk full"):
        patched.setattr(fileio.os, "replace", boom)
        store.workspace_write(agent_id=A, path="doc.txt", content="new")
    assert store.workspace_read(agent_id=A, path="doc.txt") == "old"
    assert sorted(p.name for p in (agent_dir(runtime, 3) / "workspace").iterdir()) == ["doc.txt"]
