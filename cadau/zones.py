"""Time zone names, checked against the list of the zones the system knows.

`zoneinfo.ZoneInfo(name)` opens the file `name` under the tz database: a folder of it
("Europe", "Asia", "Etc") raised IsADirectoryError, a name too long for the file system
OSError, and "posixrules" or "right/UTC" were taken. Settings, agents' config_json and the
`current_time` tool all check here, so each refuses such a name as the unknown zone it is."""

from __future__ import annotations

import zoneinfo
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _known() -> frozenset[str]:
    # ~25 ms to list, once a process.
    return frozenset(zoneinfo.available_timezones())


def zone_known(name: Any) -> bool:
    """Whether `name` is the IANA name of a zone this system has (Asia/Shanghai, UTC)."""
    return isinstance(name, str) and name in _known()
