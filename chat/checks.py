"""System checks (Django's check framework) for settings that name code: a dotted path is only
imported when first used, so a typo in AGENT_TOOLS showed as failed agent sends, not at start.
`manage.py migrate` (which `make run` runs) and `python -m cadau.serve` run these and refuse to
go on past an error."""

from __future__ import annotations

from typing import Any

from django.core import checks


def agent_tools_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every AGENT_TOOLS path imports and gives a Tool whose name no other tool has."""
    from chat.tools import tools_registered

    try:
        tools_registered()
    except Exception as exc:  # ImportError, a name taken twice, a constructor's own error
        return [
            checks.Error(
                f"AGENT_TOOLS: {type(exc).__name__}: {exc}",
                hint="Each entry is the dotted path of a chat.tools.Tool (or of a callable "
                "returning one) with a name of its own.",
                id="cadau.E001",
            )
        ]
    return []
