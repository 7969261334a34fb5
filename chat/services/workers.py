"""Where the services' sync work runs when async code (a reply, a socket) calls it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async


def in_worker(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """Run `fn` in the thread pool, with Django's connection hygiene around it.

    Not in Channels' one thread-sensitive thread: the work here is self-contained (its own
    transactions, a tool handler, a summarising LLM call), so nothing needs that thread, and
    there it would queue behind everyone else's. With 200 sends at once on PostgreSQL the last
    reply started streaming ~3 s late; in the pool the sends overlap their database round trips,
    and a slow summary or tool holds up no one (bench/realtime.py)."""
    return database_sync_to_async(fn, thread_sensitive=False)
