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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from cadau.accounts import credentials_revoked
from chat.events import ORIGIN, layer_is_shared

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


def _close_local(*, user_id: int, login: str | None) -> int:
    with _lock:
        doomed = [h for h in _open if h.user_id == user_id and (login is None or h.login == login)]
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
            async_to_sync(layer.group_send)(group, {"type": "chat.revoke", "origin": ORIGIN})
        except Exception:
            logger.exception("chat_sockets_revoke_publish_failed user=%s", user_id)

    transaction.on_commit(close)


def _sockets_close_on_revocation(
    sender: Any, user_id: int, reason: str, session_key: str | None = None, **kwargs: Any
) -> None:
    login = session_key if reason == "logout" else None
    if reason == "logout" and not session_key:
        return  # a logout without a browser login holds no socket
    sockets_close(user_id=user_id, login=login, reason=reason)


def connect_signals() -> None:
    credentials_revoked.connect(_sockets_close_on_revocation, dispatch_uid="chat_sockets_revoked")
