"""The tiny front-matter dialect of entry files.

    ---
    created: 2025-01-31T09:12:00.000000+00:00
    updated: 2025-02-01T10:00:00.000000+00:00
    source_session_id: 12
    source_message_id: 345
    tags: [preferences, tea]
    ---
    The user drinks green tea, never coffee.

Deliberately not YAML: no dependency, and nothing in it can execute or expand. Files are meant
to be hand-editable, so parsing never raises: a field it cannot read becomes None, and a block
that is not recognisably front matter (no closing fence, a line that is not `key: value`) is
treated as part of the content, so whatever a person wrote is kept, not dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

_FENCE = "---"
_FIELD_RE = re.compile(r"([a-z_]+)\s*:\s*(.*)")
# Front matter is a handful of lines; a "---" 200 lines down is a markdown rule, not a fence.
_MAX_HEADER_LINES = 40
_TAG_RE = re.compile(r"[^\s,\[\]:#\"']{1,40}")
# What a tag may hold, as the API tells its clients (agentmemory/api.py).
TAG_RULE = "1-40 characters, none of them a space, a comma, [ ] : # or a quote"

MAX_TAGS = 20


@dataclass(frozen=True)
class Parsed:
    content: str
    created: datetime | None
    updated: datetime | None
    source_session_id: int | None
    source_message_id: int | None
    tags: tuple[str, ...]


def clean_tags(raw: object) -> tuple[str, ...]:
    """Tags come from models and users: keep short tokens without the characters that would
    break the `[a, b]` line, lower-cased, de-duplicated, order kept."""
    if isinstance(raw, str):
        raw = raw.split(",")
    if not isinstance(raw, list | tuple | set | frozenset):
        return ()
    seen: dict[str, None] = {}
    for item in raw:
        if not isinstance(item, str):
            continue
        tag = item.strip().lower()
        if tag_valid(tag):
            seen.setdefault(tag, None)
    return tuple(seen)[:MAX_TAGS]


def tag_valid(tag: str) -> bool:
    return _TAG_RE.fullmatch(tag) is not None


def _parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    # A hand-written "2025-01-31" has no zone; treat it as UTC rather than fail comparisons
    # between naive and aware datetimes later.
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _parse_int(value: str) -> int | None:
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() and len(value) < 19 else None


def parse(text: str) -> Parsed:
    empty = Parsed(text.strip(), None, None, None, None, ())
    lines = text.lstrip("\ufeff").split("\n")
    if not lines or lines[0].rstrip() != _FENCE:
        return empty
    fields: dict[str, str] = {}
    for index, line in enumerate(lines[1 : _MAX_HEADER_LINES + 1], start=1):
        stripped = line.rstrip("\r")
        if stripped.rstrip() == _FENCE:
            body = "\n".join(lines[index + 1 :])
            break
        if not stripped.strip():
            continue
        match = _FIELD_RE.fullmatch(stripped.strip())
        if not match:
            return empty
        fields[match[1]] = match[2]
    else:
        return empty
    tags_raw = fields.get("tags", "").strip()
    if tags_raw.startswith("[") and tags_raw.endswith("]"):
        tags_raw = tags_raw[1:-1]
    return Parsed(
        content=body.strip(),
        created=_parse_time(fields.get("created", "")),
        updated=_parse_time(fields.get("updated", "")),
        source_session_id=_parse_int(fields.get("source_session_id", "")),
        source_message_id=_parse_int(fields.get("source_message_id", "")),
        tags=clean_tags(tags_raw),
    )


def render(
    *,
    content: str,
    created: datetime,
    updated: datetime,
    source_session_id: int | None,
    source_message_id: int | None,
    tags: tuple[str, ...],
) -> str:
    def stamp(value: datetime) -> str:
        return value.astimezone(UTC).isoformat(timespec="microseconds")

    lines = [_FENCE, f"created: {stamp(created)}", f"updated: {stamp(updated)}"]
    if source_session_id is not None:
        lines.append(f"source_session_id: {source_session_id}")
    if source_message_id is not None:
        lines.append(f"source_message_id: {source_message_id}")
    lines.append(f"tags: [{', '.join(tags)}]")
    lines.append(_FENCE)
    return "\n".join(lines) + "\n" + content.strip() + "\n"
