"""Text that users, programs and models hand us: one check for every string Cadau stores or
passes on, used by the JSON parser of the REST API, the WebSocket consumer and the services.

Two kinds of string are refused outright. A NUL character: PostgreSQL cannot store it in a
text column. An unpaired UTF-16 surrogate (JSON allows the escape "\\ud800" alone): it is not
a character, cannot be encoded as UTF-8, and fails wherever the text is written (the database,
a memory file, a password hash) with a 500 far from the request that carried it."""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
# Deeper than any request of the API needs; a walk never recurses, but a payload this nested
# is garbage, not input.
MAX_JSON_DEPTH = 64
# Up to 19 digits: every id and count fits a signed 64-bit column.
_ASCII_INT = re.compile(r"-?[0-9]{1,19}")


def text_problem(value: str) -> str | None:
    """Why `value` cannot be taken as text, or None."""
    if "\x00" in value:
        return "contains a NUL character"
    if _SURROGATE.search(value):
        return "contains an unpaired surrogate (not valid Unicode)"
    return None


def json_text_problem(data: Any) -> str | None:
    """The first problem of any string (key or value) in decoded JSON, or of its nesting;
    None when the document is fine. Iterative: no recursion however deep it is."""
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"nested more than {MAX_JSON_DEPTH} levels deep"
        if isinstance(value, str):
            problem = text_problem(value)
            if problem:
                return f"{where or 'a value'} {problem}"
        elif isinstance(value, dict):
            for key, item in value.items():
                problem = text_problem(key) if isinstance(key, str) else None
                if problem:
                    return f"a key {problem}"
                stack.append((item, depth + 1, str(key)[:40] if isinstance(key, str) else ""))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, where) for item in value)
    return None


def ascii_int(value: Any) -> int | None:
    """`value` as an integer when it is written the one way an integer prints: a JSON integer
    (not a boolean, not 1.0) or a string of ASCII digits ("12", "-3"); else None. int() also
    takes " 1", "1_0", "١٢" (Arabic-Indic) and "１２" (full-width): an id that parses to
    another number than the one it shows would send a request somewhere its text does not
    say, so such values are refused, never guessed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _ASCII_INT.fullmatch(value):
        return int(value)
    return None


def utf8_length_over(text: str, limit: int) -> bool:
    """Whether `text` takes more than `limit` bytes as UTF-8 (what the client sent): a frame
    of Chinese is three bytes a character. Encodes only frames that could be over."""
    if len(text) > limit:
        return True
    if len(text) * 4 <= limit:
        return False
    return len(text.encode("utf-8", "surrogatepass")) > limit


QUOTE = "> "


def quoted(text: str) -> str:
    """Every line of `text` behind "> ": how Cadau hands a model text that is material, not
    instructions (the session summary, recalled messages, history_search's excerpts), so that
    no line of it can pass for a header or heading of ours (those are never quoted).
    splitlines, not a split on line feeds: a lone carriage return or U+2028 starts a line for a
    model too."""
    return "\n".join(QUOTE + line for line in text.splitlines() or [""])
