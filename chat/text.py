"""Text that users, programs and models hand us: one check for every string Cadau stores or
passes on, used by the JSON parser of the REST API, the WebSocket consumer and the services.

Two kinds of string are refused outright. A NUL character: PostgreSQL cannot store it in a
text column. An unpaired UTF-16 surrogate (JSON allows the escape "\\ud800" alone): it is not
a character, cannot be encoded as UTF-8, and fails wherever the text is written (the database,
a memory file, a password hash) with a 500 far from the request that carried it."""

from __future__ import annotations

import json
import re
import unicodedata
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


def json_object_unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs (json.loads' object_pairs_hook), refusing a key given twice
    (ValueError): {"title": "a", "title": "b"} means one of them, and which is a guess (the
    last for Python, the first for some proxies that inspect bodies), so neither is taken."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return data


#: The keys each client frame type takes (docs/api.md, "WebSocket").
FRAME_KEYS = {"send": frozenset({"type", "content", "client_id"}), "cancel": frozenset({"type"})}


def frame_problem(frame: dict[str, Any]) -> str | None:
    """Why a client's WebSocket frame is refused for its shape, or None: an unknown type, or a
    key its type does not take (a `session_id` in a send went, unread, to the socket's own
    session; as a REST body's unknown field, it is refused)."""
    kind = frame.get("type")
    keys = FRAME_KEYS.get(kind) if isinstance(kind, str) else None
    if keys is None:
        return f"Unknown frame type {kind!r}; send or cancel."
    unknown = sorted(str(key) for key in set(frame) - keys)
    if unknown:
        return f"unknown field(s) in a {kind} frame: {', '.join(unknown)}"
    return None


def _constant_refused(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def frame_parse(text: str) -> tuple[dict[str, Any] | None, str]:
    """A client's WebSocket frame as a JSON object, or None and why it is refused, as the REST
    parser refuses a body: not JSON (NaN, Infinity, a key given twice), nested too deeply, not
    an object, text that is not Unicode; then its shape (frame_problem)."""
    try:
        frame = json.loads(
            text, parse_constant=_constant_refused, object_pairs_hook=json_object_unique
        )
    except RecursionError:
        return None, "The frame's JSON is nested too deeply."
    except ValueError as exc:
        detail = f": {exc}" if str(exc).startswith("duplicate key") else ""
        return None, f"The frame is not valid JSON{detail}."
    if not isinstance(frame, dict):
        return None, "A frame must be a JSON object."
    problem = json_text_problem(frame)
    if problem:
        return None, f"Invalid text: {problem}."
    problem = frame_problem(frame)
    return (None, problem) if problem else (frame, "")


# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and the bidirectional
# embeddings, overrides and isolates (a name holding U+202E reads backwards from there on, in
# the list and in every name shown after it on the same line).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# What draws nothing: format characters (zero-width space, BOM...), marks with no base,
# spaces, and the letters and symbols that are blank by design (Hangul fillers, the empty
# Braille pattern), the usual "blank name" tricks.
_INVISIBLE = {"Cf", "Mn", "Me", "Zs"}
_BLANK = {"\u115f", "\u1160", "\u3164", "\uffa0", "\u2800"}


def line_problem(value: str) -> str | None:
    """Why `value` cannot be a one-line name (a session's title, an agent's), or None: a
    newline, a tab, another control character or a bidirectional override; or, not empty,
    nothing visible at all. A title is shown on one line in the list, the page's <title>, an
    export's heading and a daily note's: "a\r\nSet-Cookie: x=1" has no place in any of them,
    and a title of zero-width spaces was a blank row in the list (a probe)."""
    if _CONTROL.search(value):
        return "contains a line break or another control character"
    if value and not _visible(value):
        return "has no visible character"
    return None


def _visible(value: str) -> bool:
    return any(c not in _BLANK and unicodedata.category(c) not in _INVISIBLE for c in value)


def line_plain(value: str) -> str:
    """`value` as one line, what line_problem would refuse turned to spaces, runs of
    whitespace made one: for a name Cadau writes itself (an automatic title, which must not
    come out empty: a session left untitled is titled again after every reply)."""
    return " ".join(_CONTROL.sub(" ", value).split())
