"""chat/checks.py and agentmemory/checks.py: settings that name code are checked at start, and
`python -m cadau.serve` refuses to serve past a failed check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core import checks

from chat.tools import Tool

ROOT = Path(__file__).resolve().parent.parent.parent

NOT_A_TOOL = object()


def _tool() -> Tool:
    return Tool(name="checked_tool", description="d", handler=lambda ctx, args: "ok")


def _errors() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks() if m.level >= checks.ERROR]


def test_the_default_settings_pass():
    assert _errors() == []


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("tests.chat.no_such_module.TOOL", "ModuleNotFoundError"),
        ("tests.chat.test_checks.NO_SUCH_NAME", "ImportError"),
        ("tests.chat.test_checks.NOT_A_TOOL", "neither a chat.tools.Tool"),
    ],
)
def test_a_bad_agent_tools_path_is_an_error_naming_it(settings, path, needle):
    settings.AGENT_TOOLS = [path]
    errors = _errors()
    assert [e.id for e in errors] == ["cadau.E001"]
    assert "AGENT_TOOLS" in errors[0].msg and needle in errors[0].msg


def test_a_good_agent_tools_path_passes(settings):
    settings.AGENT_TOOLS = ["tests.chat.test_checks._tool"]
    assert _errors() == []


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("tests.chat.no_such_module.Storage", "neither a STORAGES alias nor an importable path"),
        ("tests.chat.test_checks._tool", "did not produce a Storage"),
        ("tests.chat.test_checks.NOT_A_TOOL", "not callable"),
    ],
)
def test_a_bad_memory_storage_is_an_error_naming_it(settings, spec, needle):
    settings.AGENT_MEMORY_STORAGE = spec
    errors = _errors()
    assert [e.id for e in errors] == ["cadau.E002"]
    assert needle in errors[0].msg


def test_the_server_refuses_to_start_past_a_failed_check(tmp_path):
    env = {
        **os.environ,
        "SECRET_KEY": "x" * 50,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "RUNTIME_DIR": str(tmp_path / "runtime"),
        "AGENT_TOOLS": "tests.chat.no_such_module.TOOL",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cadau.serve",
            "-b",
            "127.0.0.1",
            "-p",
            "0",
            "cadau.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "system checks failed" in done.stderr and "cadau.E001" in done.stderr


def test_a_silenced_check_does_not_stop_the_server(settings):
    from cadau.serve import startup_checks

    settings.AGENT_TOOLS = ["tests.chat.no_such_module.TOOL"]
    assert any("cadau.E001" in line for line in startup_checks())
    settings.SILENCED_SYSTEM_CHECKS = ["cadau.E001"]
    assert startup_checks() == []


def _first() -> Tool:
    return Tool(name="checked_first", description="d", handler=lambda ctx, args: "ok")


BAD_NAME = Tool(name="no spaces allowed", description="d", handler=lambda ctx, args: "ok")


def test_a_bad_entry_after_good_ones_registers_none_of_them(settings):
    """A review: the name and handler checks came after the first entries were registered, so
    a factory's tool, registered again on the next try, was then 'already registered'."""
    from chat.tools import tools_registered

    settings.AGENT_TOOLS = ["tests.chat.test_checks._first", "tests.chat.test_checks.BAD_NAME"]
    assert [e.id for e in _errors()] == ["cadau.E001"]
    assert [e.id for e in _errors()] == ["cadau.E001"]  # the same error again, not another
    settings.AGENT_TOOLS = []
    assert "checked_first" not in tools_registered()
