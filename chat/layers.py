"""The channel layer of a single process (no REDIS_URL).

Channels' InMemoryChannelLayer sweeps every channel and every group for expired entries on each
`send`, `group_send` and `receive`: O(sockets) work per streamed token, so 200 streaming
sockets cost O(200^2) per token round and the process fell tens of seconds behind
(bench/realtime.py). Entries expire after a minute; sweeping once a second keeps that
guarantee to the second at O(1) per message.
"""

from __future__ import annotations

import time
from typing import Any

from channels.layers import InMemoryChannelLayer as _ChannelsInMemoryLayer


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
