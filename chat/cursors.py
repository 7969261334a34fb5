"""Opaque, tamper-evident paging cursors.

A cursor is a position in a keyset (never an OFFSET), signed with SECRET_KEY and a salt of its
own so it cannot be forged, edited, or replayed as some other signed value of the app. Each one
names what it pages (`kind`), the scope it belongs to (a session id, or the owner for the session
list) and the direction it walks: a cursor is only accepted by the page it was issued for, so a
cursor copied from another session, another user or another endpoint is a 400, not a silent
jump into the wrong data.

No max_age: a cursor is a bookmark into immutable ids, and an old one must keep working after a
long pause (a tab left open overnight). Truncation may delete the message a cursor points at;
keyset comparisons on ids stay correct anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.core import signing

SALT = "cadau.chat.cursor.v1"
# Real cursors are ~80 characters; refusing huge input early keeps garbage cheap to reject.
MAX_CURSOR_LENGTH = 512
MAX_ID = 2**63 - 1

Direction = Literal["older", "newer"]
MessageKind = Literal["history", "turns"]
_DIRECTIONS = ("older", "newer")


class InvalidCursor(ValueError):
    """Malformed, forged, or issued for another session/user/endpoint/direction."""


@dataclass(frozen=True, slots=True)
class MessageCursor:
    """A position in one session's message ids: `older` pages take ids < message_id,
    `newer` pages take ids > message_id."""

    kind: MessageKind
    session_id: int
    message_id: int
    direction: Direction


@dataclass(frozen=True, slots=True)
class SessionListCursor:
    """A position in one owner's session list, ordered by (last_activity_at desc, id desc)."""

    owner_id: int
    last_activity_at: datetime
    session_id: int


def _sign(payload: list[Any]) -> str:
    return signing.dumps(payload, salt=SALT, compress=False)


def _unsign(cursor: Any) -> list[Any]:
    if not isinstance(cursor, str) or not cursor or len(cursor) > MAX_CURSOR_LENGTH:
        raise InvalidCursor("Malformed cursor.")
    try:
        payload = signing.loads(cursor, salt=SALT)
    except signing.BadSignature:
        raise InvalidCursor("Malformed or tampered cursor.") from None
    except (ValueError, UnicodeError):  # base64/JSON garbage that happens to carry a ':'
        raise InvalidCursor("Malformed cursor.") from None
    if not isinstance(payload, list) or not payload:
        raise InvalidCursor("Malformed cursor.")
    return payload


def _is_id(value: Any, *, allow_zero: bool = False) -> bool:
    # bool is an int subclass; a signed payload never holds one, but be strict anyway.
    low = 0 if allow_zero else 1
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_ID


def encode_message_cursor(
    *, kind: MessageKind, session_id: int, message_id: int, direction: Direction
) -> str:
    # message_id 0 is legal: "newer than 0" is how an empty session hands out a cursor that
    # later fetches its first messages.
    return _sign(["m", kind, session_id, message_id, direction])


def decode_message_cursor(
    *, cursor: Any, kind: MessageKind, session_id: int, direction: Direction | None = None
) -> MessageCursor:
    payload = _unsign(cursor)
    if len(payload) != 5 or payload[0] != "m":
        raise InvalidCursor("Malformed cursor.")
    _, got_kind, got_session, message_id, got_direction = payload
    if got_kind != kind:
        raise InvalidCursor("This cursor belongs to another list.")
    if not _is_id(got_session) or not _is_id(message_id, allow_zero=True):
        raise InvalidCursor("Malformed cursor.")
    if got_direction not in _DIRECTIONS:
        raise InvalidCursor("Malformed cursor.")
    if got_session != session_id:
        raise InvalidCursor("This cursor belongs to another session.")
    if direction is not None and got_direction != direction:
        raise InvalidCursor(f"This cursor pages {got_direction} messages, not {direction} ones.")
    return MessageCursor(
        kind=got_kind, session_id=got_session, message_id=message_id, direction=got_direction
    )


def encode_session_list_cursor(
    *, owner_id: int, last_activity_at: datetime, session_id: int
) -> str:
    return _sign(["s", owner_id, last_activity_at.isoformat(), session_id])


def decode_session_list_cursor(*, cursor: Any, owner_id: int) -> SessionListCursor:
    payload = _unsign(cursor)
    if len(payload) != 4 or payload[0] != "s":
        raise InvalidCursor("Malformed cursor.")
    _, got_owner, stamp, session_id = payload
    if not _is_id(got_owner) or not _is_id(session_id) or not isinstance(stamp, str):
        raise InvalidCursor("Malformed cursor.")
    if got_owner != owner_id:
        raise InvalidCursor("This cursor belongs to another user.")
    try:
        last_activity_at = datetime.fromisoformat(stamp)
    except ValueError:
        raise InvalidCursor("Malformed cursor.") from None
    if last_activity_at.tzinfo is None:
        raise InvalidCursor("Malformed cursor.")
    return SessionListCursor(
        owner_id=got_owner, last_activity_at=last_activity_at, session_id=session_id
    )


@dataclass(frozen=True, slots=True)
class SearchCursor:
    """A position in one search: the next page takes matching ids < message_id. Bound to the
    owner, the scope (a session id, or 0 for all of the owner's sessions), the role filter and
    the query text, so a cursor cannot carry one search's position into another."""

    owner_id: int
    session_id: int
    role: str
    query_key: str
    message_id: int


def encode_search_cursor(
    *, owner_id: int, session_id: int, role: str, query_key: str, message_id: int
) -> str:
    return _sign(["q", owner_id, session_id, role, query_key, message_id])


def decode_search_cursor(
    *, cursor: Any, owner_id: int, session_id: int, role: str, query_key: str
) -> SearchCursor:
    payload = _unsign(cursor)
    if len(payload) != 6 or payload[0] != "q":
        raise InvalidCursor("Malformed cursor.")
    _, got_owner, got_session, got_role, got_key, message_id = payload
    if (
        not _is_id(got_owner)
        or not _is_id(got_session, allow_zero=True)
        or not _is_id(message_id)
        or not isinstance(got_role, str)
        or not isinstance(got_key, str)
    ):
        raise InvalidCursor("Malformed cursor.")
    if got_owner != owner_id:
        raise InvalidCursor("This cursor belongs to another user.")
    if (got_session, got_role, got_key) != (session_id, role, query_key):
        raise InvalidCursor("This cursor belongs to another search.")
    return SearchCursor(
        owner_id=got_owner,
        session_id=got_session,
        role=got_role,
        query_key=got_key,
        message_id=message_id,
    )
