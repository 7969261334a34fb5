"""How other processes learn that a process generating replies died (kill -9, a crash, the
machine gone), within seconds rather than STALE_STREAMING_SECONDS.

- While it generates anything, a process renews its lease (chat.models.GeneratorLease, keyed by
  chat.events.ORIGIN) every third of CHAT_REPLY_LEASE_SECONDS: one statement per process, not
  per reply, whatever the number of replies. Its reply rows name it (`generator`).
- A `streaming` row whose process's lease lapsed, and which saw no progress for as long, is
  orphaned (chat.models.reply_orphaned): no longer live for the busy check, regenerate,
  truncate or a socket's resume, so the session takes a new send at once.
- Every process with sockets open sweeps such rows every half lease (`reaper_ensure`): each
  is stored `failed` with the text its last progress save holds, and every socket of its
  session, in every process, gets `error` and `done` (chat/turn/replies.py). A send on the
  session does the same for its own rows, and `python -m cadau.serve` sweeps at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from chat.events import ORIGIN, local_sockets_open
from chat.models import GeneratorLease
from chat.turn.replies import streaming_sweep
from chat.workers import in_worker

logger = logging.getLogger("chat.reply")


def lease_renew(*, process: str = ORIGIN, seconds: int | None = None) -> None:
    """Extend `process`'s lease to `seconds` from now (CHAT_REPLY_LEASE_SECONDS): one
    INSERT ... ON CONFLICT UPDATE."""
    span = settings.CHAT_REPLY_LEASE_SECONDS if seconds is None else seconds
    lease = GeneratorLease(process=process, expires_at=timezone.now() + timedelta(seconds=span))
    GeneratorLease.objects.bulk_create(
        [lease], update_conflicts=True, unique_fields=["process"], update_fields=["expires_at"]
    )


class _Renewer:
    """The lease of this process, renewed by one task per event loop while replies run on it."""

    def __init__(self) -> None:
        self.holders = 0
        self.task: asyncio.Task[None] | None = None
        self.failing = False

    def hold(self) -> None:
        self.holders += 1
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while self.holders:
            try:
                await in_worker(lease_renew)()
                self.failing = False
            except Exception:
                # The database is away: the replies' own writes fail too. Logged once a spell.
                if not self.failing:
                    logger.exception("chat_lease_renew_failed process=%s", ORIGIN)
                self.failing = True
            await asyncio.sleep(settings.CHAT_REPLY_LEASE_SECONDS / 3)


_renewers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Renewer] = (
    weakref.WeakKeyDictionary()
)


@contextlib.asynccontextmanager
async def lease_held() -> AsyncIterator[None]:
    """This process's lease is renewed for as long as the block runs (a reply's generation)."""
    loop = asyncio.get_running_loop()
    renewer = _renewers.get(loop)
    if renewer is None:
        renewer = _renewers[loop] = _Renewer()
    renewer.hold()
    try:
        yield
    finally:
        renewer.holders -= 1


_reapers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
    weakref.WeakKeyDictionary()
)


def reaper_ensure() -> None:
    """Sweep orphaned replies every half lease while this process has sockets open (called
    when one connects): their sockets, wherever they are, are told of a dead process's
    replies within a lease and a half."""
    loop = asyncio.get_running_loop()
    task = _reapers.get(loop)
    if task is None or task.done():
        _reapers[loop] = asyncio.ensure_future(_reap())


async def _reap() -> None:
    failing = False
    while True:
        await asyncio.sleep(settings.CHAT_REPLY_LEASE_SECONDS / 2)
        if not local_sockets_open():
            return
        try:
            swept = await in_worker(streaming_sweep)()
            failing = False
        except Exception:
            if not failing:
                logger.exception("chat_reaper_sweep_failed")
            failing = True
            continue
        if swept:
            logger.warning("chat_replies_orphaned_failed count=%d", swept)
