"""What a WebSocket is sent of a reply, and how it recovers events it never got.

Events of other processes cross the channel layer, which can lose them: a full channel
(channels-redis drops past its capacity), a Redis outage. A socket that missed one must not
show a wrong text or a reply that never ends. So, per socket (chat/consumers.py):

- Each reply's characters already sent are counted (`_held`): a piece it holds is trimmed, and
  a delta that starts past them (a gap: a piece was lost) is held back while the generating
  process is asked for the text so far, which comes as one delta at offset 0 (`_gap`).
- While a reply streams to it, a watchdog checks a reply that went quiet for QUIET_SECONDS
  against the database and sends its `done` if it ended (`_watch_quiet`): a lost `done`.
- After an outage of the layer, `_catch_up` does both at once: `done` for replies that ended,
  and the reply still generating as it stands.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from chat.turn import reply_ends, reply_resume, reply_watch

logger = logging.getLogger("chat.consumers")

# A reply this socket streams that sent nothing for this long is checked in the database.
QUIET_SECONDS = 3.0
# A gap asks the generating process for the text so far at most this often per reply.
GAP_ASK_SECONDS = 1.0


class ReplySync:
    """Mixed into the consumer; `_sync_init` from its state init."""

    session_id: int
    _send_frame: Callable[[dict[str, Any]], Awaitable[None]]
    _open: bool
    send_json: Callable[..., Awaitable[None]]

    def _sync_init(self) -> None:
        # How much of each reply this socket has been sent (message id -> characters): a
        # piece it already holds (resume, a catch-up from another process) is trimmed.
        self._held: dict[int, int] = {}
        self._gap_asked: dict[int, float] = {}
        self._last_event = time.monotonic()
        self._watchdog: asyncio.Task[None] | None = None
        self._asks: set[asyncio.Task[None]] = set()

    def _sync_stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    async def _forward(self, event: dict[str, Any]) -> None:
        """Send a session event to the client, less any part of a reply it already holds."""
        if getattr(self, "_closed", False):
            return  # closed by us: a frame sent now would log "send on a closed protocol"
        kind = event.get("type")
        self._last_event = time.monotonic()
        if kind == "delta":
            trimmed = self._unseen(event)
            if trimmed is None:
                return
            event = trimmed
        elif kind == "done":
            self._held.pop(event.get("message", {}).get("id"), None)
        await self._send_frame({"type": "websocket.send", "text": orjson.dumps(event).decode()})

    def _unseen(self, event: dict[str, Any]) -> dict[str, Any] | None:
        message_id, offset, text = event.get("message_id"), event.get("offset"), event["text"]
        if not isinstance(message_id, int) or not isinstance(offset, int):
            return event
        watchdog = self._watchdog
        if watchdog is None or watchdog.done():
            self._watchdog_ensure()
        held = self._held.get(message_id, 0)
        if offset > held:
            self._held[message_id] = held
            self._gap()
            return None
        end = offset + len(text)
        if end <= held:
            return None
        self._held[message_id] = end
        if offset == held:
            return event
        return {**event, "text": text[held - offset :], "offset": held}

    def _gap(self) -> None:
        """A piece of the reply never came: ask its process for the text so far (at most
        every GAP_ASK_SECONDS); what follows is held back until that arrives."""
        now = time.monotonic()
        if now - self._gap_asked.get(self.session_id, -GAP_ASK_SECONDS) < GAP_ASK_SECONDS:
            return
        self._gap_asked[self.session_id] = now
        task = asyncio.ensure_future(reply_watch(session_id=self.session_id))
        self._asks.add(task)
        task.add_done_callback(self._asks.discard)

    def _watchdog_ensure(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.ensure_future(self._watch_quiet())

    async def _watch_quiet(self) -> None:
        while self._held and self._open:
            await asyncio.sleep(QUIET_SECONDS)
            if self._held and time.monotonic() - self._last_event >= QUIET_SECONDS:
                try:
                    await self._ends_check()
                except Exception:  # the database is away: the next round asks again
                    logger.debug("chat_socket_ends_check_failed", exc_info=True)

    async def _ends_check(self) -> None:
        """`done` for the replies this socket streams that ended (their `done` was lost);
        replies gone from the database are forgotten."""
        ends, streaming = await reply_ends(session_id=self.session_id, message_ids=list(self._held))
        for event in ends:
            await self._forward(event)
        for message_id in [m for m in self._held if m not in streaming]:
            del self._held[message_id]

    async def _catch_up(self) -> None:
        """Resynchronise from the database after events may have been lost: a reply this
        socket was streaming that ended meanwhile gets its `done`; one still generating is
        sent as it stands (a `message`), and its process asked for the text so far."""
        await self._ends_check()
        resume = await reply_resume(session_id=self.session_id)
        if resume is not None:
            message = resume["message"]
            self._held[message["id"]] = len(message["content"])
            self._watchdog_ensure()
            await self.send_json(resume)
            await reply_watch(session_id=self.session_id)
