from datetime import UTC, datetime

import pytest
from django.core import signing

from chat.cursors import (
    SALT,
    InvalidCursor,
    decode_message_cursor,
    decode_session_list_cursor,
    encode_message_cursor,
    encode_session_list_cursor,
)


def _history(session_id=7, message_id=42, direction="older"):
    return encode_message_cursor(
        kind="history", session_id=session_id, message_id=message_id, direction=direction
    )


def test_message_cursor_round_trip():
    cursor = _history()
    decoded = decode_message_cursor(cursor=cursor, kind="history", session_id=7, direction="older")
    assert (decoded.session_id, decoded.message_id, decoded.direction) == (7, 42, "older")


def test_cursor_is_opaque_text_without_raw_ids_in_the_clear():
    cursor = _history(message_id=123456789)
    assert isinstance(cursor, str)
    assert "123456789" not in cursor


@pytest.mark.parametrize(
    "garbage",
    ["", "x", "abc:def", ":", "a" * 600, "eyJ9:xxx", "%%%%:%%%%", None, 12, ["a"]],
)
def test_garbage_is_rejected(garbage):
    with pytest.raises(InvalidCursor):
        decode_message_cursor(cursor=garbage, kind="history", session_id=7)


def test_tampered_payload_or_signature_is_rejected():
    cursor = _history()
    payload, _, signature = cursor.rpartition(":")
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    with pytest.raises(InvalidCursor):
        decode_message_cursor(cursor=f"{payload}:{flipped}", kind="history", session_id=7)
    other_payload = _history(message_id=43).rpartition(":")[0]
    with pytest.raises(InvalidCursor):
        decode_message_cursor(cursor=f"{other_payload}:{signature}", kind="history", session_id=7)


def test_value_signed_with_another_salt_is_rejected():
    forged = signing.dumps(["m", "history", 7, 1, "older"], salt="something-else")
    with pytest.raises(InvalidCursor):
        decode_message_cursor(cursor=forged, kind="history", session_id=7)
    # Correct salt but a payload shape we never issue.
    odd = signing.dumps(["m", "history", 7, -1, "older"], salt=SALT)
    with pytest.raises(InvalidCursor):
        decode_message_cursor(cursor=odd, kind="history", session_id=7)
    odd = signing.dumps({"session": 7}, salt=SALT)
    with pytest.raises(InvalidCursor):
        decode_message_cursor(cursor=odd, kind="history", session_id=7)


def test_other_session_kind_or_direction_is_rejected():
    cursor = _history(session_id=7)
    with pytest.raises(InvalidCursor, match="another session"):
        decode_message_cursor(cursor=cursor, kind="history", session_id=8)
    with pytest.raises(InvalidCursor, match="another list"):
        decode_message_cursor(cursor=cursor, kind="turns", session_id=7)
    with pytest.raises(InvalidCursor):
        decode_message_cursor(cursor=cursor, kind="history", session_id=7, direction="newer")


def test_session_list_cursor_round_trip_and_owner_check():
    stamp = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    cursor = encode_session_list_cursor(owner_id=3, last_activity_at=stamp, session_id=99)
    decoded = decode_session_list_cursor(cursor=cursor, owner_id=3)
    assert (decoded.last_activity_at, decoded.session_id) == (stamp, 99)
    with pytest.raises(InvalidCursor, match="another user"):
        decode_session_list_cursor(cursor=cursor, owner_id=4)
    with pytest.raises(InvalidCursor):
        decode_session_list_cursor(cursor=_history(), owner_id=3)
    with pytest.raises(InvalidCursor):
        decode_message_cursor(cursor=cursor, kind="history", session_id=3)
