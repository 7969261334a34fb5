"""Name safety: nothing a caller supplies may resolve outside the agent's folder."""

from __future__ import annotations

import contextlib
import os
import posixpath
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from django.core.files.storage import FileSystemStorage
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agentmemory import paths, store
from agentmemory.paths import UnsafeName
from tests.agentmemory.conftest import agent_dir, fake_root

pytestmark = pytest.mark.usefixtures("fake_agents")

AGENT = 7
ROOT = fake_root(AGENT)

# Pieces attackers (and confused models) use; hypothesis glues them together with junk.
_FRAGMENTS = [
    "..",
    ".",
    "/",
    "//",
    "\\",
    "%2e%2e%2f",
    "%2e%2e",
    "%2f",
    "%5c",
    "..%2f",
    "%00",
    "\x00",
    "/etc/passwd",
    "C:\\",
    "~",
    "\u2215",
    "\uff0f",
    "\u2024\u2024",
    "\uff0e\uff0e",
    "\u2044",
    "\u29f8",
    "\ufe68",
    "\u200b",
    "a",
    "b.md",
    "notes",
    "2024-01-01.md",
    "-",
    "_",
    " ",
    "\n",
    "\ud7ff",
    "é",
    "記",
    "CON",
    "x" * 120,
]
names = st.one_of(
    st.lists(st.sampled_from(_FRAGMENTS), max_size=12).map("".join),
    st.text(max_size=300),
    st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=8)), max_size=20).map(
        "/".join
    ),
)


def _assert_confined(storage_name: str, *, prefix: str) -> None:
    # Lexically: under the prefix, already normal (no "..", ".", "//"), nothing exotic.
    assert storage_name.startswith(prefix)
    assert posixpath.normpath(storage_name) == storage_name
    assert ".." not in storage_name.split("/")
    assert storage_name.isascii()
    for bad in ("\\", "\x00", "%", "\n"):
        assert bad not in storage_name


@hsettings(max_examples=600, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names)
def test_fuzz_no_name_resolves_outside_the_agent_root(name, tmp_path: Path):
    storage = FileSystemStorage(location=tmp_path)
    real_root = os.path.join(os.path.realpath(tmp_path), ROOT)
    candidates = []
    for build, prefix in (
        (lambda n: paths.workspace_storage_name(root=ROOT, path=n), f"{ROOT}/workspace/"),
        (lambda n: paths.entry_storage_name(root=ROOT, name=n), f"{ROOT}/memory/entries/"),
    ):
        try:
            storage_name = build(name)
        except UnsafeName:
            continue
        _assert_confined(storage_name, prefix=prefix)
        candidates.append(storage_name)
    try:
        day = paths.parse_daily_note_filename(name)
    except UnsafeName:
        pass
    else:
        assert name == f"{day.isoformat()}.md"
    for storage_name in candidates:
        absolute = paths.filesystem_path(storage=storage, root=ROOT, name=storage_name)
        assert absolute is not None
        assert os.path.realpath(absolute).startswith(real_root + os.sep)


@hsettings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names)
def test_fuzz_store_functions_refuse_or_stay_inside(name, runtime: Path):
    outside = runtime.parent
    before = sorted(p.name for p in outside.iterdir())
    try:
        store.workspace_write(agent_id=AGENT, path=name, content="x")
    except UnsafeName:
        pass
    else:
        assert (agent_dir(runtime, AGENT) / "workspace" / name).is_file()
    with contextlib.suppress(UnsafeName, store.MemoryNotFound):
        store.entry_read(agent_id=AGENT, name=name)
    assert sorted(p.name for p in outside.iterdir()) == before


@given(agent_id=st.one_of(st.integers(), st.booleans(), st.text(), st.floats(), st.none()))
def test_fuzz_agent_id(agent_id):
    try:
        checked = paths.checked_agent_id(agent_id)
    except UnsafeName:
        return
    assert type(agent_id) is int and agent_id > 0 and checked == agent_id


@pytest.mark.parametrize("agent_id", [0, -1, True, "1", 1.0, None, 2**64])
def test_bad_agent_ids(agent_id):
    with pytest.raises(UnsafeName):
        store.entry_list(agent_id=agent_id)


@given(root=st.one_of(st.text(), st.uuids().map(str), st.integers(), st.none()))
def test_fuzz_folder_names_are_canonical_uuids_only(root):
    try:
        checked = paths.checked_root(root)
    except UnsafeName:
        return
    assert isinstance(root, str) and str(__import__("uuid").UUID(root)) == checked == root


@pytest.mark.parametrize(
    "root",
    [
        "7",
        "..",
        "",
        "A" * 36,
        "ABCDEF00-0000-0000-0000-00000000000A",
        ROOT + "/x",
        ROOT.replace("-", ""),
    ],
)
def test_bad_folder_names(root):
    with pytest.raises(UnsafeName):
        paths.memory_dir(root=root)


@pytest.mark.parametrize(
    "path",
    [
        "",
        "..",
        "../x",
        "a/../../x",
        "a/..",
        "./a",
        "a/./b",
        "/etc/passwd",
        "//x",
        "a//b",
        "a/",
        "a\\b",
        "..\\x",
        "a\x00b",
        "%2e%2e%2fx",
        "..%2fx",
        "a%2fb",
        "a\uff0fb",
        "a\u2215b",
        "\uff0e\uff0e/x",
        "\u2024\u2024/x",
        ".hidden",
        "a/.git/config",
        "a.",
        "caf\u00e9.txt",
        "\ufb01le.txt",
        "x" * 256,
        "/".join(["a"] * 9),
        "CON",
        "nul.txt",
        "docs/com1.md",
        "a b",
        "a\nb",
        "~/x",
        "C:\\x",
        "C:x",
    ],
)
def test_bad_workspace_paths(path):
    with pytest.raises(UnsafeName):
        paths.workspace_storage_name(root=ROOT, path=path)


@pytest.mark.parametrize(
    "path", ["a.txt", "docs/notes-1.md", "A_b/c.d.e", "_x", "1/2/3/4/5/6/7/8", "x" * 100]
)
def test_good_workspace_paths(path):
    assert paths.workspace_storage_name(root=ROOT, path=path) == f"{ROOT}/workspace/{path}"


@pytest.mark.parametrize(
    "name", ["", "Foo", "foo.txt", "-x", "_x", "../x", "a/b", "a.b", "x" * 82, "é", ".md", None]
)
def test_bad_entry_names(name):
    with pytest.raises(UnsafeName):
        paths.entry_stem(name)


@pytest.mark.parametrize("name", ["foo", "foo.md", "a-b_c", "0", "x" * 81])
def test_good_entry_names(name):
    assert paths.entry_storage_name(root=ROOT, name=name).endswith(
        f"/entries/{name.removesuffix('.md')}.md"
    )


@pytest.mark.parametrize(
    "name",
    [
        "2023-02-29.md",
        "2024-13-01.md",
        "24-01-01.md",
        "2024-01-01",
        "2024-01-01.md/../x",
        "\uff12\uff10\uff12\uff14-01-01.md",
        "2024-1-01.md",
        "0000-01-01.md",
        "2024-01-01.txt",
    ],
)
def test_bad_daily_names(name):
    with pytest.raises(UnsafeName):
        paths.parse_daily_note_filename(name)


def test_good_daily_names():
    assert paths.parse_daily_note_filename("2024-02-29.md") == date(2024, 2, 29)
    # How agentmemory/store.py names a day's note: the memory folder, then the file name.
    name = f"{paths.memory_dir(root=ROOT)}/{paths.daily_note_filename(date(2024, 2, 29))}"
    assert name == f"{ROOT}/memory/2024-02-29.md"


def test_day_must_be_a_date_not_a_datetime_or_string():
    from datetime import datetime

    days: list[Any] = [datetime(2024, 1, 1), "2024-01-01"]
    for day in days:
        with pytest.raises(UnsafeName):
            paths.daily_note_filename(day)


# --- symlinks planted inside the root -------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret.txt").write_text("top secret")
    return target


def test_symlinked_directory_pointing_outside_is_refused(runtime: Path, outside: Path):
    store.workspace_write(agent_id=AGENT, path="ok.txt", content="fine")
    (agent_dir(runtime, 7) / "workspace" / "evil").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeName):
        store.workspace_read(agent_id=AGENT, path="evil/secret.txt")
    with pytest.raises(UnsafeName):
        store.workspace_write(agent_id=AGENT, path="evil/new.txt", content="x")
    assert not (outside / "new.txt").exists()
    assert store.workspace_list(agent_id=AGENT) == ["ok.txt"]


def test_symlinked_file_pointing_outside_is_refused(runtime: Path, outside: Path):
    workspace = agent_dir(runtime, 7) / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "link.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(UnsafeName):
        store.workspace_read(agent_id=AGENT, path="link.txt")
    with pytest.raises(UnsafeName):
        store.workspace_write(agent_id=AGENT, path="link.txt", content="overwrite")
    assert (outside / "secret.txt").read_text() == "top secret"
    assert store.workspace_list(agent_id=AGENT) == []


def test_dangling_symlink_to_outside_is_refused(runtime: Path, outside: Path):
    workspace = agent_dir(runtime, 7) / "workspace"
    workspace.mkdir(parents=True)
    (workspace / "new.txt").symlink_to(outside / "not-yet.txt")
    with pytest.raises(UnsafeName):
        store.workspace_write(agent_id=AGENT, path="new.txt", content="x")
    assert not (outside / "not-yet.txt").exists()


def test_symlinked_entry_and_daily_note_are_refused(runtime: Path, outside: Path):
    store.entry_write(agent_id=AGENT, name="real", content="A real fact")
    entries = agent_dir(runtime, 7) / "memory" / "entries"
    (entries / "leak.md").symlink_to(outside / "secret.txt")
    with pytest.raises(UnsafeName):
        store.entry_read(agent_id=AGENT, name="leak")
    assert [e.name for e in store.entry_list(agent_id=AGENT)] == ["real"]
    (agent_dir(runtime, 7) / "memory" / "2025-01-01.md").symlink_to(outside / "secret.txt")
    with pytest.raises(UnsafeName):
        store.daily_note_append(agent_id=AGENT, day=date(2025, 1, 1), heading="h", body="b")
    with pytest.raises(UnsafeName):
        store.daily_note_read(agent_id=AGENT, day=date(2025, 1, 1))
    assert (outside / "secret.txt").read_text() == "top secret"


def test_a_symlinked_daily_note_is_not_listed(runtime: Path, outside: Path):
    """As the workspace listing: a day that cannot be read is not offered. (It was listed.)"""
    store.daily_note_append(agent_id=AGENT, day=date(2025, 1, 2), heading="h", body="real")
    memory = agent_dir(runtime, 7) / "memory"
    (memory / "2025-01-01.md").symlink_to(outside / "secret.txt")
    (memory / "2025-01-03.md").symlink_to(outside / "missing.txt")
    # A link that stays inside the agent's folder can be read, so it is listed.
    (memory / "2025-01-04.md").symlink_to(memory / "2025-01-02.md")
    days = store.daily_note_list(agent_id=AGENT)
    assert days == [date(2025, 1, 4), date(2025, 1, 2)]
    assert "real" in store.daily_note_read(agent_id=AGENT, day=date(2025, 1, 4))


def test_symlinked_memory_folder_pointing_outside_is_refused(runtime: Path, outside: Path):
    (agent_dir(runtime, 7) / "memory").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeName):
        store.daily_note_append(agent_id=AGENT, day=date(2025, 1, 1), heading="h", body="b")
    with pytest.raises(UnsafeName):
        store.entry_write(agent_id=AGENT, name=None, content="fact")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_symlinked_agent_root_is_refused(runtime: Path, outside: Path):
    agent_dir(runtime, 7, create=False).symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeName):
        store.workspace_write(agent_id=AGENT, path="x.txt", content="x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_symlink_that_stays_inside_the_agent_root_is_allowed(runtime: Path):
    store.workspace_write(agent_id=AGENT, path="real/a.txt", content="inside")
    (agent_dir(runtime, 7) / "workspace" / "alias").symlink_to(
        agent_dir(runtime, 7) / "workspace" / "real", target_is_directory=True
    )
    assert store.workspace_read(agent_id=AGENT, path="alias/a.txt") == "inside"


def test_symlink_into_another_agents_folder_is_refused(runtime: Path):
    store.workspace_write(agent_id=8, path="mine.txt", content="agent 8 only")
    (agent_dir(runtime, 7) / "workspace").mkdir(parents=True)
    (agent_dir(runtime, 7) / "workspace" / "peek").symlink_to(
        agent_dir(runtime, 8) / "workspace", target_is_directory=True
    )
    with pytest.raises(UnsafeName):
        store.workspace_read(agent_id=AGENT, path="peek/mine.txt")


def test_symlinked_runtime_dir_itself_is_fine(settings, tmp_path: Path):
    real = tmp_path / "real-runtime"
    real.mkdir()
    (tmp_path / "link-runtime").symlink_to(real, target_is_directory=True)
    settings.RUNTIME_DIR = tmp_path / "link-runtime"
    settings.AGENT_MEMORY_STORAGE = ""
    store.workspace_write(agent_id=AGENT, path="a.txt", content="ok")
    assert (real / ROOT / "workspace" / "a.txt").read_text() == "ok"
