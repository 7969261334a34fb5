"""chat/turn/registry.py: work held back until a reply's first token."""

from __future__ import annotations

import asyncio

from chat.turn.registry import AFTER_FIRST_TOKEN_DELAY_SECONDS, Generation


def _generation(seen: list[str]) -> Generation:
    return Generation(session_id=1, subscribers=[lambda event: seen.append(event["type"])])


def test_work_waits_for_the_first_delta_then_runs_once():
    seen: list[str] = []
    gen = _generation(seen)
    gen.after_first_token(lambda: seen.append("compact"))
    gen.publish({"type": "message"})
    gen.publish({"type": "compaction", "state": "started"})
    assert "compact" not in seen
    gen.publish({"type": "delta", "message_id": 1, "text": "a", "offset": 0})
    gen.publish({"type": "delta", "message_id": 1, "text": "b", "offset": 1})
    assert seen == ["message", "compaction", "delta", "compact", "delta"]
    gen.after_first_token(lambda: seen.append("late"))  # past it: runs at once
    assert seen[-1] == "late"


def test_a_reply_that_fails_before_any_token_releases_it_at_done():
    seen: list[str] = []
    gen = _generation(seen)
    gen.after_first_token(lambda: seen.append("compact"))
    gen.publish({"type": "done", "message": {}})
    assert seen == ["done", "compact"]


def test_a_reply_that_published_nothing_releases_it_when_it_ends():
    seen: list[str] = []
    gen = _generation(seen)
    gen.after_first_token(lambda: seen.append("compact"))
    gen.first_token_passed()
    gen.first_token_passed()
    assert seen == ["compact"]


async def test_on_a_loop_the_work_starts_a_moment_after_the_token():
    """Time for the subscribers to write the token before a compaction thread takes the GIL."""
    seen: list[str] = []
    gen = _generation(seen)
    gen.after_first_token(lambda: seen.append("compact"))
    gen.publish({"type": "delta", "message_id": 1, "text": "a", "offset": 0})
    assert seen == ["delta"]
    await asyncio.sleep(AFTER_FIRST_TOKEN_DELAY_SECONDS * 3)
    assert seen == ["delta", "compact"]
