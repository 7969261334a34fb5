"""WebSocket `/ws/chat/<session_id>/`: the realtime face of a chat session (SPEC, "API contract").

Thin on purpose: the handshake checks, framing and dispatch live here; storing turns, running
and cancelling replies live in chat.services.realtime and chat.services.reply.

Handshake. Refused before `accept` (Daphne then answers the upgrade with HTTP 403; an ASGI test
client sees the close code):
- foreign Origin: refused by `AllowedHostsOriginValidator` (cadau/asgi.py);
- 4401: not authenticated (Django session cookie; the socket carries no token header);
- 4404: unknown session, or another user's session (indistinguishable, as in the REST API).

Client -> server:
- `{"type": "send", "content": str, "client_id": str?}`: validated like `POST /chat/send`;
  idempotent on client_id. While another reply of the session is generating the send waits up
  to CHAT_SEND_QUEUE_SECONDS, then fails with `reply_in_progress`. The wait never blocks this
  socket: it can still `cancel` meanwhile. One queued send per socket.
- `{"type": "cancel"}`: stops the session's running reply (in whatever process it runs) within
  200 ms; the partial is stored as `cancelled` and a `done` carrying it follows.

Server -> client (every socket of the session, in every process, gets the same events: sockets
of the publishing process straight from it, the others through the session's channel group,
chat/services/events.py; events to "this socket only" are noted):
- `{"type": "message", "message": message}`: the stored user message of a send. Also sent to
  this socket only (a) right after connect when the session has a reply still generating:
  `message` is that assistant row with status `streaming` and its partial text, to which the
  client keeps appending the `delta`s that follow (when another process generates it, the
  partial is the last progress save, up to SAVE_EVERY_SECONDS old, and that process then sends
  the whole text so far as one delta at offset 0), and (b) for a repeated client_id.
- `{"type": "delta", "message_id": int, "text": str, "offset": int, "emitted_at"?: float}`: the
  next piece of a reply (one token, or several coalesced when the server is busy); `offset` is
  where `text` starts in the reply's content. This socket never gets a piece twice: what it
  already holds (after a resume, or a catch-up from another process) is cut off. `emitted_at`
  (optional metadata) is the LLM server's own emit time of the chunk when it reports one (the
  fake server's `x_emit_ts`); it lets a client measure the latency this server adds.
- `{"type": "compaction", "state": "started" | "done" | "failed"}`.
- `{"type": "tool_call", "message": message}`: an assistant message with `tool_calls` (a round of
  the agent tool loop), and `{"type": "tool_result", "message": message}`: the stored `tool`
  message answering one call (`tool_call_id`). Emitted through the rounds seam
  (chat/services/toolloop.py); this consumer forwards them like any other group event.
- `{"type": "done", "message": message, "context_budget": {...}}`: the stored reply, final
  status `complete`, `failed` or `cancelled`. To this socket only for a repeated client_id.
- `{"type": "error", "code": str, "message": str}`: `bad_request` (not JSON, unknown type, wrong
  field types; the socket stays open), the REST send's codes (`invalid`, `message_too_large`,
  `reply_in_progress`, `not_found`), `nothing_to_cancel`, and reply failures broadcast to the
  group (`llm_stream_cut`, `llm_error`, `context_too_large`, followed by `done` with the partial
  stored as `failed`).

Close codes after accept: 4408 when the client reads so slowly that OUTBOX_LIMIT events wait
for it (it can reconnect and resume).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import orjson
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404

from chat.selectors import session_for_user
from chat.services.events import (
    ORIGIN,
    LocalSocket,
    layer_is_shared,
    local_socket_add,
    local_socket_remove,
    session_group,
)
from chat.services.realtime import (
    control_group,
    error_event,
    socket_cancel,
    socket_resume,
    socket_send,
    socket_watch,
)

logger = logging.getLogger("chat.consumers")

# Scope key under which cadau/asgi.py passes the server's own ASGI `send` (an extension key:
# the middlewares copy scopes whole, so it reaches the consumer).
SERVER_SEND = "cadau.server_send"

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
# The client reads slower than its events arrive (chat.services.events.OUTBOX_LIMIT behind).
CLOSE_TOO_SLOW = 4408


def _bad_request(message: str) -> dict[str, Any]:
    return error_event(code="bad_request", message=message)


class ChatConsumer(AsyncJsonWebsocketConsumer):
    session_id: int
    group: str

    async def connect(self) -> None:
        self.group = ""
        # Session events (a frame per streamed token) go to the server's own ASGI send when
        # cadau/asgi.py passed it on, else to ours: send_json -> send -> AsyncConsumer.send ->
        # the session middleware's send add four awaits and a lazy session lookup per frame,
        # and none of them acts on `websocket.send` (the session is saved only with an HTTP
        # response). Everything else (accept, close, errors) keeps the regular path.
        self._send_frame = self.scope.get(SERVER_SEND) or self.base_send
        self._pending_send: asyncio.Task[None] | None = None
        self._open = False
        self._local: LocalSocket | None = None
        self._writer: asyncio.Task[None] | None = None
        # How much of each reply this socket has been sent (message id -> characters): a
        # piece it already holds (resume, a catch-up from another process) is trimmed.
        self._held: dict[int, int] = {}
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        try:
            session = await database_sync_to_async(session_for_user)(
                user=user, session_id=self.scope["url_route"]["kwargs"]["session_id"]
            )
        except Http404:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.session_id = session.pk
        self.group = session_group(session.pk)
        # Subscribe before reading the live reply, so no delta falls between the two; what
        # arrives meanwhile waits in the outbox (local) or the channel (other processes) until
        # this handler returns.
        self._local = LocalSocket(session_id=session.pk)
        local_socket_add(self._local)
        await self.channel_layer.group_add(self.group, self.channel_name)
        if layer_is_shared(self.channel_layer):
            await self.channel_layer.group_add(control_group(session.pk), self.channel_name)
        await self.accept()
        self._open = True
        resume = await socket_resume(session_id=self.session_id)
        if resume is not None:
            message = resume["message"]
            self._held[message["id"]] = len(message["content"])
            await self.send_json(resume)
        # After the resumed partial: what was published meanwhile follows it, in order.
        self._writer = asyncio.ensure_future(self._forward_local(self._local))
        if resume is not None:
            # A reply is being generated, maybe in another process: ask for its deltas. (One
            # that starts later announces itself with chat.generating: this socket is already
            # in the control group.)
            await socket_watch(session_id=self.session_id)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        # Channels' version, less its close_old_connections hop (see dispatch). This consumer
        # joins its groups itself (connect) and leaves them in disconnect; `groups` is empty.
        await self.disconnect(message.get("code", 1000))
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        self._open = False
        if self._local is not None:
            local_socket_remove(self._local)
        if self._writer is not None:
            self._writer.cancel()
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            if layer_is_shared(self.channel_layer):
                await self.channel_layer.group_discard(
                    control_group(self.session_id), self.channel_name
                )
        # A queued send is left running: the user pressed send, the turn is theirs, and a
        # retry with the same client_id finds it.

    async def _forward_local(self, local: LocalSocket) -> None:
        """Events published in this process, in order (chat/services/events.py)."""
        try:
            while True:
                batch = await local.take()
                if local.overflowed:
                    await self.close(code=CLOSE_TOO_SLOW)
                    return
                for event in batch:
                    await self._forward(event)
        except Exception:  # the socket went away under us: disconnect() cleans up
            logger.debug("chat_socket_forward_stopped session=%s", self.session_id, exc_info=True)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            await self.send_json(_bad_request("Frames must be JSON text."))
            return
        try:
            content = json.loads(text_data)
        except ValueError:
            await self.send_json(_bad_request("The frame is not valid JSON."))
            return
        if not isinstance(content, dict):
            await self.send_json(_bad_request("A frame must be a JSON object."))
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        kind = content.get("type")
        if kind == "send":
            await self._on_send(content)
        elif kind == "cancel":
            for event in await socket_cancel(session_id=self.session_id):
                await self.send_json(event)
        else:
            await self.send_json(_bad_request(f"Unknown frame type {kind!r}; send or cancel."))

    async def _on_send(self, frame: dict[str, Any]) -> None:
        text, client_id = frame.get("content"), frame.get("client_id")
        if not isinstance(text, str):
            await self.send_json(_bad_request("content must be a string."))
            return
        if client_id is not None and not isinstance(client_id, str):
            await self.send_json(_bad_request("client_id must be a string."))
            return
        if self._pending_send is not None and not self._pending_send.done():
            await self.send_json(
                error_event(
                    code="reply_in_progress",
                    message="A send of this socket is still waiting for the current reply.",
                )
            )
            return
        # A task, so waiting in the session's queue never stalls this socket's receive loop.
        self._pending_send = asyncio.ensure_future(self._send_turn(text, client_id))

    async def _send_turn(self, text: str, client_id: str | None) -> None:
        events = await socket_send(
            user=self.scope["user"], session_id=self.session_id, content=text, client_id=client_id
        )
        for event in events:
            if self._open:
                await self.send_json(event)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels runs close_old_connections in the one thread-sensitive worker before every
        # handler (and once more after a disconnect). This consumer never touches the ORM on
        # that thread: its database work goes through database_sync_to_async, which does the
        # same hygiene around every call. So the hop is skipped for what arrives in numbers:
        # layer messages (every event of every socket would queue behind one thread), client
        # frames and disconnects (200 sends, then 200 closes, at once: 600 hops, each a GIL
        # hand-off the streaming replies wait for, bench/realtime.py). Connects keep it.
        kind = message.get("type")
        if kind == "websocket.receive":
            await self.websocket_receive(message)
            return
        if kind == "websocket.disconnect":
            await self.websocket_disconnect(message)
            return
        if kind == "chat.event":
            if message.get("origin") != ORIGIN:  # this process's events came locally
                await self._forward(message["event"])
            return
        if kind == "chat.generating":
            if message.get("origin") != ORIGIN:
                # A reply started in another process: ask it for its deltas.
                await socket_watch(session_id=self.session_id)
            return
        if kind in ("chat.watch", "chat.cancel"):
            return  # for generating processes, not sockets
        await super().dispatch(message)

    async def _forward(self, event: dict[str, Any]) -> None:
        """Send a session event to the client, less any part of a reply it already holds."""
        kind = event.get("type")
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
        held = self._held.get(message_id, 0)
        end = offset + len(text)
        if end <= held:
            return None
        self._held[message_id] = end
        if offset >= held:
            return event
        return {**event, "text": text[held - offset :], "offset": held}

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        # orjson: a frame per streamed token per socket, and the stdlib encoder was ~5% of the
        # server's CPU with 200 streaming sockets (bench/realtime.py). UTF-8 as is, like
        # ensure_ascii=False.
        return orjson.dumps(content).decode()
