"""Who holds the open WebSockets, so that what ended a login ends its sockets too.

A socket is opened with a browser login (Django session cookie) and used to live on after a
logout, a password change or the user's deactivation: its next `send` was still stored and
answered. Now each socket registers here while open; `credentials_revoked`
(cadau/accounts.py) closes the sockets of that login (logout) or of the user (password,
deactivation) in this process at once, and in other processes through the channel layer
(their sockets are in the user's and the login's groups). The register also counts a user's
sockets for CHAT_MAX_SOCKETS_PER_USER (per process: a crashed process leaves no count
behind)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework.authtoken.models import Token

from cadau.accounts import credentials_revoked
from chat.events import ORIGIN, group_send_from_sync, layer_is_shared
from chat.workers import in_worker

logger = logging.getLogger("chat.sockets")


def user_group(user_id: int) -> str:
    return f"chat_user_{user_id}"


def login_group(session_key: str) -> str:
    # Group names are limited in length and alphabet; the session key is a secret besides.
    return "chat_login_" + hashlib.sha256(session_key.encode()).hexdigest()[:32]


@dataclass(eq=False)
class SocketHandle:
    user_id: int
    login: str
    loop: asyncio.AbstractEventLoop
    close: Callable[[], Any]
    # A server-sent-events response rather than a socket: opened with this API token ("" for
    # a browser login), by a user whose password hash was this. What the stream watch checks
    # (`streams_watch`): a stream holds no channel in the layer's groups.
    token: str = ""
    password: str = ""
    stream: bool = False


_open: set[SocketHandle] = set()
_lock = threading.Lock()


def socket_register(handle: SocketHandle, *, cap: int) -> bool:
    """Register an open socket; False (nothing registered) when its user already holds `cap`
    sockets in this process (0: no cap)."""
    with _lock:
        held = sum(1 for h in _open if h.user_id == handle.user_id)
        if cap and held >= cap:
            return False
        _open.add(handle)
        return True


def socket_unregister(handle: SocketHandle) -> None:
    with _lock:
        _open.discard(handle)


def _close_local(*, user_id: int, login: str | None, tokens_only: bool = False) -> int:
    with _lock:
        doomed = [
            h
            for h in _open
            if h.user_id == user_id
            and (login is None or h.login == login)
            and (not tokens_only or h.token)
        ]
    for handle in doomed:
        with contextlib.suppress(RuntimeError):  # its loop is gone, and the socket with it
            handle.loop.call_soon_threadsafe(handle.close)
    return len(doomed)


def sockets_close(*, user_id: int, login: str | None, reason: str) -> None:
    """Close the sockets of a login (`login`: its session key) or of every login of the user,
    after the transaction that revoked them commits."""

    def close() -> None:
        closed = _close_local(user_id=user_id, login=login)
        logger.info("chat_sockets_revoked user=%s reason=%s local=%d", user_id, reason, closed)
        layer = get_channel_layer()
        if not layer_is_shared(layer):
            return
        group = login_group(login) if login else user_group(user_id)
        try:
            group_send_from_sync(layer, group, {"type": "chat.revoke", "origin": ORIGIN})
        except Exception:
            logger.exception("chat_sockets_revoke_publish_failed user=%s", user_id)

    transaction.on_commit(close)


def _sockets_close_on_revocation(
    sender: Any, user_id: int, reason: str, session_key: str | None = None, **kwargs: Any
) -> None:
    if reason == "token":
        # Sockets are opened with a browser login; only streams opened with the key end.
        # Other processes' streams: their watch finds the key gone within a second.
        transaction.on_commit(lambda: _close_local(user_id=user_id, login=None, tokens_only=True))
        return
    login = session_key if reason == "logout" else None
    if reason == "logout" and not session_key:
        return  # a logout without a browser login holds no socket
    sockets_close(user_id=user_id, login=login, reason=reason)


def connect_signals() -> None:
    credentials_revoked.connect(_sockets_close_on_revocation, dispatch_uid="chat_sockets_revoked")


# --- server-sent-events streams ----------------------------------------------------------------
# A stream ends with its credentials as a socket does. In this process the register above
# closes it at once (the signal); a revocation made in another process reaches it through a
# watch of this process's streams, which checks their credentials every STREAM_CHECK_SECONDS
# in a few queries for all of them (a stream holds no channel in the layer's groups).

STREAM_CHECK_SECONDS = 0.5


def _credentials_ended(handles: list[SocketHandle]) -> list[SocketHandle]:
    """The streams whose user is gone, inactive or has another password, whose token is
    revoked, or whose browser login ended."""
    users = dict(
        (pk, (active, password))
        for pk, active, password in get_user_model()
        .objects.filter(pk__in={h.user_id for h in handles})
        .values_list("pk", "is_active", "password")
    )
    keys = {h.token for h in handles if h.token}
    tokens = (
        set(Token.objects.filter(key__in=keys).values_list("key", flat=True)) if keys else set()
    )
    store = import_module(settings.SESSION_ENGINE).SessionStore
    logins = {h.login for h in handles if h.login and not h.token}
    alive = {key for key in logins if store().exists(key)}
    ended = []
    for h in handles:
        active, password = users.get(h.user_id, (False, ""))
        if (
            not active
            or (h.password and password != h.password)
            or (h.token and h.token not in tokens)
            or (h.login and not h.token and h.login not in alive)
        ):
            ended.append(h)
    return ended


def stream_register(handle: SocketHandle) -> None:
    """Register an open event stream; the process's watch starts with the first."""
    with _lock:
        _open.add(handle)
    watch = _watches.get(handle.loop)
    if watch is None or watch.done():
        _watches[handle.loop] = asyncio.ensure_future(_streams_watch(handle.loop))


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
    weakref.WeakKeyDictionary()
)


async def _streams_watch(loop: asyncio.AbstractEventLoop) -> None:
    """Close this loop's streams whose credentials ended, wherever they were revoked."""
    while True:
        await asyncio.sleep(STREAM_CHECK_SECONDS)
        with _lock:
            streams = [h for h in _open if h.stream and h.loop is loop]
        if not streams:
            return
        try:
            ended = await in_worker(_credentials_ended)(streams)
        except Exception:  # the database is away: the next round asks again
            logger.debug("chat_streams_watch_failed", exc_info=True)
            continue
        for handle in ended:
            logger.info("chat_stream_revoked user=%s", handle.user_id)
            handle.close()
