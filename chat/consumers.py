"""WebSocket `/ws/chat/<session_id>/`: the realtime face of a chat session (docs/api.md).

Thin on purpose: the handshake checks, framing, dispatch and the translation of domain errors
into `error` events live here; storing turns, running and cancelling replies live in the turn
service (chat/turn/).

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
chat/events.py; events to "this socket only" are noted):
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
- `compaction`, `tool_call`, `tool_result`, `title`, `memory`: forwarded like any other group
  event (docs/api.md lists them).
- `{"type": "done", "message": message, "context_budget": {...}}`: the stored reply, final
  status `complete`, `failed` or `cancelled`. To this socket only for a repeated client_id.
- `{"type": "error", "code": str, "message": str}`: `bad_request` (the socket stays open), the
  REST send's codes (limits' carry `retry_after`), and reply failures broadcast to the group,
  each followed by `done` with the partial stored as `failed` (docs/api.md).

Lost events are not shown as wrong text: a delta past what this socket holds (a message the
layer dropped) is held back and the generating process asked for the text so far; a reply
this socket streams that goes quiet is checked against the database, and its `done` sent if
it ended; after a Redis outage the socket catches up the same way (`_catch_up`).

Close codes after accept: 4012 when the channel layer (Redis) is back after an outage, so the
client reconnects and catches up; 4408 when the client reads so slowly that OUTBOX_LIMIT events wait
for it (it can reconnect and resume); 4429 after an `error` with `retry_after` for a socket
past CHAT_MAX_SOCKETS_PER_USER or a frame past WS_MAX_FRAMES_PER_MINUTE; 4401 when the login
the socket was opened with ends (logout, password change, deactivation: chat/services/sockets.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY
from django.db import InterfaceError, OperationalError

from chat.errors import ChatError, LoginEnded, NotFound, NothingToCancel
from chat.events import (
    ORIGIN,
    LocalSocket,
    layer_is_shared,
    local_socket_add,
    local_socket_remove,
    session_group,
)
from chat.layers import LinkedConsumer, layer_outage_seen, memberships_drop, memberships_hold
from chat.selectors import session_opened_for_user
from chat.services.sockets import (
    SocketHandle,
    login_group,
    socket_register,
    socket_unregister,
    user_group,
)
from chat.shapes import error_event
from chat.socketsync import ReplySync
from chat.text import frame_parse, utf8_length_over
from chat.turn import reaper_ensure, reply_cancel, reply_resume, reply_watch, turn_open
from chat.turn.registry import control_group, reply_cancel_ahead
from chat.workers import in_worker

logger = logging.getLogger("chat.consumers")

# Scope key under which cadau/asgi.py passes the server's own ASGI `send` (an extension key:
# the middlewares copy scopes whole, so it reaches the consumer).
SERVER_SEND = "cadau.server_send"

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
# The client reads slower than its events arrive (chat.events.OUTBOX_LIMIT behind).
CLOSE_TOO_SLOW = 4408
# Too many sockets for the user (CHAT_MAX_SOCKETS_PER_USER), or frames for the socket
# (WS_MAX_FRAMES_PER_MINUTE); an `error` event with `retry_after` comes first.
CLOSE_TOO_MANY = 4429
SOCKET_RETRY_SECONDS = 5
# The channel layer came back after an outage: reconnect to catch up.
CLOSE_RESYNC = 4012
# The database does not answer at connect (a restart): reconnect in a moment.
CLOSE_TRY_LATER = 4013
DB_UNAVAILABLE = (OperationalError, InterfaceError)


def _error_event(exc: ChatError) -> dict[str, Any]:
    # A limit's refusal says when to come back, as the REST API's Retry-After does.
    return error_event(code=exc.code, message=exc.message, retry_after=exc.retry_after)


def _monotonic() -> float:
    # One place to read the frame window's clock, so tests can move it.
    return time.monotonic()


def _bad_request(message: str) -> dict[str, Any]:
    return error_event(code="bad_request", message=message)


class ChatConsumer(LinkedConsumer, ReplySync, AsyncJsonWebsocketConsumer):
    session_id: int
    group: str

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        try:
            session = await in_worker(session_opened_for_user)(
                user=user, session_id=self.scope["url_route"]["kwargs"]["session_id"]
            )
        except NotFound:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        except DB_UNAVAILABLE:  # a database restarting: "try again later", no traceback
            await self.close(code=CLOSE_TRY_LATER)
            return
        session_key = getattr(self.scope.get("session"), "session_key", None) or ""
        # Read when the login was (the middleware loaded the session): checked on every send.
        self._login_hash = str(self.scope["session"].get(HASH_SESSION_KEY) or "")
        if not await self._register(user_id=user.pk, session_key=session_key):
            return
        self.session_id = session.pk
        await self._subscribe(user_id=user.pk, session_key=session_key)
        await self.accept()
        self._open = True
        # A reply whose process dies is failed, and this socket told, within seconds.
        reaper_ensure()
        await self._resume()

    def _state_init(self) -> None:
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
        self._sync_init()
        self._handle: SocketHandle | None = None
        self._closing: asyncio.Task[None] | None = None
        self._control_groups: list[str] = []
        # The login this socket was opened with has ended (`_revoke`): nothing more is done
        # for it, whatever frames are still in flight.
        self._revoked = False
        self._login_hash = ""  # the login's session auth hash, read when it connects
        # Frames in the current minute, against WS_MAX_FRAMES_PER_MINUTE.
        self._frames = (0, 0)
        # This side has sent its close: what the client sent before it saw the close, and events
        # published meanwhile, are dropped (the server would refuse them, `close`).
        self._closed = False

    async def _register(self, *, user_id: int, session_key: str) -> bool:
        """Count the socket against CHAT_MAX_SOCKETS_PER_USER; past it the client is told why
        and the socket closed (False)."""
        self._handle = SocketHandle(
            user_id=user_id,
            login=session_key,
            loop=asyncio.get_running_loop(),
            close=self._revoke,
        )
        if socket_register(self._handle, cap=settings.CHAT_MAX_SOCKETS_PER_USER):
            return True
        self._handle = None
        await self.accept()
        await self.send_json(
            error_event(
                code="too_many_sockets",
                message="You have as many sockets open as this server allows.",
                retry_after=SOCKET_RETRY_SECONDS,
            )
        )
        await self.close(code=CLOSE_TOO_MANY)
        return False

    async def _subscribe(self, *, user_id: int, session_key: str) -> None:
        """Join the session's events, before the live reply is read (`_resume`), so no delta
        falls between the two; what arrives meanwhile waits in the outbox (local) or the
        channel (other processes) until the connect handler returns."""
        self.group = session_group(self.session_id)
        self._local = LocalSocket(session_id=self.session_id)
        local_socket_add(self._local)
        if layer_is_shared(self.channel_layer):
            # Control messages, and revocations sent from other processes.
            self._control_groups = [control_group(self.session_id), user_group(user_id)]
            if session_key:
                self._control_groups.append(login_group(session_key))
        try:
            await self._groups_join()
        except Exception:
            # The layer is down: this process's events still come (the outbox), and the
            # link joins the groups once it answers again.
            layer_outage_seen()
            if self._link is not None:
                self._link.lost = True

    async def _groups_join(self) -> None:
        groups = (self.group, *self._control_groups)
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        if layer_is_shared(self.channel_layer):
            memberships_hold(
                layer=self.channel_layer,
                channel=self.channel_name,
                groups=groups,
                on_back=self._layer_back,
            )

    async def _rejoin(self) -> None:
        """This socket's link saw the layer fail and answer again: join the groups again (a
        restarted Redis lost them), then `_layer_back`."""
        await self._groups_join()
        self._layer_back()

    def _layer_back(self) -> None:
        """The layer is back after an outage or a restart (chat/layers.py). Whole replies of
        other processes may have come and gone meanwhile, which no `done` check can know of:
        the socket is closed (4012: ASGI servers allow only 1000 and 3000-4999), and the
        client reconnects and catches up from the history, as after any reconnect."""
        if self._open and self._closing is None:
            self._closing = asyncio.ensure_future(self.close(code=CLOSE_RESYNC))

    async def _resume(self) -> None:
        """The reply being generated as the socket connects, as a `message` with its partial
        text; then this process's events, in order after it."""
        assert self._local is not None
        resume = await reply_resume(session_id=self.session_id)
        if resume is not None and self._local.holds_message(
            resume["message"]["id"], (resume["message"].get("metadata") or {}).get("reply_to", 0)
        ):
            # The reply began after this socket subscribed (a send just as it connected): the
            # outbox holds the message it answers or its own announcement, and every event of
            # it follows in order. A snapshot sent first would put the reply ahead of the
            # message it answers, then announce it twice.
            resume = None
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
            await reply_watch(session_id=self.session_id)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        # Channels' version, less its close_old_connections hop (see dispatch). This consumer
        # joins its groups itself (connect) and leaves them in disconnect; `groups` is empty.
        await self.disconnect(message.get("code", 1000))
        raise StopConsumer()

    def _bookkeeping_undo(self) -> None:
        """What this process holds for the socket: its user's count, its outbox, its writer.
        Idempotent; run at disconnect and whenever the consumer ends."""
        self._open = False
        self._sync_stop()
        if getattr(self, "channel_name", None):
            memberships_drop(channel=self.channel_name)
        if self._handle is not None:
            socket_unregister(self._handle)
            self._handle = None
        if self._local is not None:
            local_socket_remove(self._local)
        if self._writer is not None:
            self._writer.cancel()

    async def disconnect(self, code: int) -> None:
        self._bookkeeping_undo()
        try:
            for group in (self.group, *self._control_groups) if self.group else ():
                await self.channel_layer.group_discard(group, self.channel_name)
        except Exception:  # the layer is down: its groups expire on their own
            layer_outage_seen()
        await self._channel_receive_end()
        # A queued send is left running: the user pressed send, the turn is theirs, and a
        # retry with the same client_id finds it.

    async def _channel_receive_end(self) -> None:
        """Let the consumer's pending channel read end with a message of its own before
        Channels cancels it: a channels-redis receive cancelled mid-read (BZPOPMIN, redis-py 8)
        can stay cancelling for good, reading on, which leaks a Redis poller per closed socket
        and hangs whatever awaits the consumer's end (as the reply's listener is stopped,
        chat/turn/registry.py)."""
        if self.channel_layer is None or not getattr(self, "channel_name", None):
            return
        try:
            await self.channel_layer.send(self.channel_name, {"type": "chat.closed"})
        except Exception:  # the layer is down: the cancel is all there is left
            logger.debug("chat_socket_receive_end_failed", exc_info=True)

    async def _forward_local(self, local: LocalSocket) -> None:
        """Events published in this process, in order (chat/events.py)."""
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

    def _revoke(self) -> None:
        """The login this socket was opened with ended (chat/services/sockets.py). Frames the
        client sent before the close reached it are dropped (`receive`), and a send waiting in
        the session's queue is abandoned: neither may be stored on the ended credentials."""
        self._revoked = True
        if self._open:
            self._closing = asyncio.ensure_future(self.close(code=CLOSE_UNAUTHENTICATED))

    def _over_frame_rate(self) -> bool:
        cap = settings.WS_MAX_FRAMES_PER_MINUTE
        minute = int(_monotonic() // 60)
        count = self._frames[1] + 1 if self._frames[0] == minute else 1
        self._frames = (minute, count)
        return bool(cap) and count > cap

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        """Once this side closed, nothing more goes out: Daphne refuses a send on a closing
        socket by raising, and a flood of frames queued behind the close (a client closed with
        4429) was answered one raise, one logged traceback, each."""
        if self._closed:
            return
        self._closed = True
        self._open = False
        await super().close(code=code, reason=reason)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self._revoked or self._closed:
            return
        if self._over_frame_rate():
            # 5,000 bad frames in a second cost the server as much as 5,000 good ones.
            await self.send_json(
                error_event(
                    code="throttled", message="Too many frames; reconnect later.", retry_after=60
                )
            )
            await self.close(code=CLOSE_TOO_MANY)
            return
        if text_data is None:
            await self.send_json(_bad_request("Frames must be JSON text."))
            return
        if utf8_length_over(text_data, settings.WS_MAX_FRAME_BYTES):
            await self.send_json(
                _bad_request(f"The frame is over the limit of {settings.WS_MAX_FRAME_BYTES} bytes.")
            )
            return
        # The REST API's parser checks the same (chat/text.py).
        content, problem = frame_parse(text_data)
        if content is None:
            await self.send_json(_bad_request(problem))
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if content["type"] == "send":  # the only other type frame_parse lets in: cancel
            await self._on_send(content)
        else:
            try:
                await reply_cancel(session_id=self.session_id)
            except NothingToCancel as exc:
                if self._pending_send is None or self._pending_send.done():
                    await self.send_json(_error_event(exc))
                else:  # right behind its own send, still being stored: stop it as it starts
                    reply_cancel_ahead(session_id=self.session_id)
            except ChatError as exc:
                await self.send_json(_error_event(exc))

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
        """Store the turn and start its reply; the session's sockets get its events. Only
        errors and an idempotent repeat are for this socket alone."""
        started = None
        try:
            run = await turn_open(
                user=self.scope["user"],
                session_id=self.session_id,
                content=text,
                client_id=client_id,
                abandoned=lambda: self._revoked,
                login_hash=self._login_hash,
            )
        except LoginEnded:
            self._revoke()  # as the message that did not reach this process would have
            return
        except ChatError as exc:
            events = [_error_event(exc)]
        except DB_UNAVAILABLE:
            events = [
                error_event(
                    code="service_unavailable",
                    message="The server cannot reach its database just now; send again shortly.",
                    retry_after=SOCKET_RETRY_SECONDS,
                )
            ]
        else:
            # A repeat's report is this socket's alone; a new reply's events reach it through
            # the session's group, as they reach every socket of the session.
            events = run.own
            started = run.start()  # a send that queued was started when ready() stored it
        if started is None:  # no reply: a cancel asked ahead for one is forgotten
            reply_cancel_ahead(session_id=self.session_id, asked=False)
        for event in events:
            if self._open and not self._revoked:
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
                await reply_watch(session_id=self.session_id)
            return
        if kind in ("chat.watch", "chat.cancel", "chat.closed"):
            return  # for generating processes, not sockets; or this socket's own end
        if kind == "chat.revoke":
            if message.get("origin") != ORIGIN:  # this process closed its own already
                self._revoke()
            return
        await super().dispatch(message)

    @classmethod
    async def encode_json(cls, content: Any) -> str:
        # orjson: a frame per streamed token per socket makes the encoder a visible share of
        # the server's CPU under load (bench/realtime.py). UTF-8 as is, like
        # ensure_ascii=False.
        return orjson.dumps(content).decode()
