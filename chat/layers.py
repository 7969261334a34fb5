"""The channel layer of a single process (no REDIS_URL), and a socket's link to the shared
one that survives a Redis outage (`LayerLink`).

Channels' InMemoryChannelLayer sweeps every channel and every group for expired entries on each
`send`, `group_send` and `receive`: O(sockets) work per streamed token, so 200 streaming
sockets cost O(200^2) per token round and the process fell tens of seconds behind
(bench/realtime.py). Entries expire after a minute; sweeping once a second keeps that
guarantee to the second at O(1) per message.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from channels.consumer import AsyncConsumer
from channels.exceptions import StopConsumer
from channels.layers import InMemoryChannelLayer as _ChannelsInMemoryLayer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from django.conf import settings


class InMemoryChannelLayer(_ChannelsInMemoryLayer):
    sweep_every_seconds = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._swept_at = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at < self.sweep_every_seconds:
            return
        self._swept_at = now
        super()._clean_expired()


# --- a socket's link to the shared layer (channels-redis), through a Redis outage ------------

logger = logging.getLogger("chat.realtime")
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 5.0


class _Outage:
    """Whether the shared layer is failing, so the log says so once per outage, not once per
    socket per retry (a 20 s outage logged ~1,500 "Exception inside application" a process)."""

    down = False

    @classmethod
    def seen(cls) -> None:
        if not cls.down:
            cls.down = True
            logger.warning(
                "chat_layer_unavailable: sockets keep this process's events and rejoin their "
                "groups when it is back",
                exc_info=True,
            )

    @classmethod
    def over(cls) -> None:
        if cls.down:
            cls.down = False
            logger.warning("chat_layer_back")


def layer_outage_seen() -> None:
    _Outage.seen()


class LayerLink:
    """A socket's receive from the shared layer that waits out an outage instead of ending
    the consumer (Channels' own loop lets the exception kill it, and the socket closes with
    1011). While the layer fails the socket stays open: events of its own process still reach
    it, sends still work. When the layer answers again `rejoin` runs first (the groups may be
    gone with a restarted Redis; and what was missed meanwhile is sent again), then the
    receive goes on."""

    def __init__(self, *, layer: Any, channel: str, rejoin: Callable[[], Awaitable[None]]) -> None:
        self.layer, self.channel, self.rejoin = layer, channel, rejoin
        # The groups are to be joined (again) before the next receive.
        self.lost = False

    async def receive(self) -> dict[str, Any]:
        delay = RETRY_FIRST_SECONDS
        while True:
            try:
                if self.lost:
                    await self.rejoin()
                    self.lost = False
                    _Outage.over()
                message: dict[str, Any] = await self.layer.receive(self.channel)
                return message
            except Exception:
                _Outage.seen()
                self.lost = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)


# --- group memberships, renewed while the socket lives ------------------------------------------

# channel -> (its layer, the groups it is in, what to do when the layer is back after an
# outage): this process's sockets' memberships.
_memberships: dict[str, tuple[Any, tuple[str, ...], Callable[[], None]]] = {}
_renewers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}
# How often the layer is checked for a restart that lost the groups (a key of this process's
# own that a restarted Redis no longer has) or an outage.
CANARY_SECONDS = 2.0
CANARY_KEY = "cadau-canary-" + uuid.uuid4().hex


def memberships_hold(
    *, layer: Any, channel: str, groups: tuple[str, ...], on_back: Callable[[], None]
) -> None:
    """Keep `channel` in `groups` for as long as it is held: channels-redis drops a member
    after its `group_expiry` (set short, so a killed process's channels leave the groups), so
    live ones join again every third of it. When the layer comes back from an outage or a
    restart (which loses every group) they join again at once, and `on_back` runs."""
    _memberships[channel] = (layer, groups, on_back)
    loop = asyncio.get_running_loop()
    task = _renewers.get(loop)
    if task is None or task.done():
        _renewers[loop] = asyncio.ensure_future(_memberships_renew(loop, layer))


def memberships_drop(*, channel: str) -> None:
    _memberships.pop(channel, None)


async def _rejoin_all(*, back: bool) -> None:
    for channel, (layer, groups, on_back) in list(_memberships.items()):
        if channel not in _memberships:
            continue
        for group in groups:
            await layer.group_add(group, channel)
        if back:
            on_back()


async def _canary_lost(layer: Any) -> bool:
    """Whether the layer lost its data since the last look (a Redis restarted empty): this
    process's own key is gone. Raises while the layer does not answer."""
    connection = getattr(layer, "connection", None)
    if connection is None:
        return False
    client = connection(0)
    key = f"{getattr(layer, 'prefix', '')}{CANARY_KEY}"
    existed = await client.exists(key)
    await client.set(key, "1", ex=int(settings.CHANNEL_GROUP_EXPIRY_SECONDS))
    return not existed


async def _memberships_renew(loop: asyncio.AbstractEventLoop, layer: Any) -> None:
    renew_every = settings.CHANNEL_GROUP_EXPIRY_SECONDS / 3
    renewed = time.monotonic()
    first = True
    try:
        while _memberships:
            await asyncio.sleep(min(CANARY_SECONDS, renew_every))
            try:
                lost = await _canary_lost(layer)
                if _Outage.down or (lost and not first):
                    _Outage.over()
                    await _rejoin_all(back=True)
                    renewed = time.monotonic()
                elif time.monotonic() - renewed >= renew_every:
                    await _rejoin_all(back=False)
                    renewed = time.monotonic()
                first = False
            except Exception:
                _Outage.seen()
    finally:
        if _renewers.get(loop) is asyncio.current_task():
            del _renewers[loop]


class LinkedConsumer(AsyncConsumer):
    """Channels' AsyncConsumer loop with two changes for failing dependencies: the layer is
    read through a LayerLink (a Redis outage no longer ends every socket with 1011 and a
    traceback), and `_bookkeeping_undo` runs however the consumer ends (a connect that failed
    after registering its socket left its user counted, refused with 4429 until the process
    restarted). Subclasses provide `_state_init`, `_rejoin` and `_bookkeeping_undo`."""

    _link: LayerLink | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.base_send = send
        self._state_init()
        sources = [receive]
        if self.channel_layer is not None:
            self.channel_name = await self.channel_layer.new_channel()
            self._link = LayerLink(
                layer=self.channel_layer, channel=self.channel_name, rejoin=self._rejoin
            )
            sources.append(self._link.receive)
        try:
            await await_many_dispatch(sources, self.dispatch)
        except StopConsumer:
            pass
        finally:
            self._bookkeeping_undo()

    def _state_init(self) -> None:
        raise NotImplementedError

    async def _rejoin(self) -> None:
        raise NotImplementedError

    def _bookkeeping_undo(self) -> None:
        raise NotImplementedError
