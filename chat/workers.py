"""Where sync work runs when it must not hold up its caller.

- `in_worker(fn)`: async code (a reply, a socket) awaiting sync service work in the thread pool.
- `background_submit(fn, **kwargs)`: work nobody awaits (compaction after a reply) in a small
  bounded pool, so a burst of replies cannot start a thread storm.
- `model_wait_run(fn, owner=..., **kwargs)`: a request awaiting a summarising model call
  ("compact now"), one per user at a time.
- `embedding_submit(fn, **kwargs)`: the background embedder (semantic recall), on its own thread.
- `warm_submit(key, fn, **kwargs)`: a read ahead of the send it is for (recall's window when a
  chat is opened), on its own thread, one per key, dropped when too many wait.
- `foreground_enter()` / `foreground_exit(key)` around a send's way to its first token, and
  `background_yield()` between the steps of background work: the work waits while a send is
  on its way.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from channels.db import database_sync_to_async
from django.db import close_old_connections, connections

from chat.errors import CompactionInProgress

logger = logging.getLogger("chat.background")


def in_worker(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """Run `fn` in the thread pool, with Django's connection hygiene around it.

    Not in Channels' one thread-sensitive thread: the work here is self-contained (its own
    transactions, a tool handler, a summarising LLM call), so nothing needs that thread, and
    there it would queue behind everyone else's. With 200 sends at once on PostgreSQL the last
    reply started streaming ~3 s late; in the pool the sends overlap their database round trips,
    and a slow summary or tool holds up no one."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            # Also here, inside the call's own context: Channels closes connections outside
            # it, where asgiref can show a thread other storage for its connections (seen as
            # pooled PostgreSQL connections of finished threads never handed back).
            close_old_connections()

    return database_sync_to_async(run, thread_sensitive=False)


_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cadau-bg")
# The jobs not done yet: nothing here waits on them, tests and benchmarks do
# (devtools/introspect.py).
_pending: set[Future[Any]] = set()


def _run(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    close_old_connections()
    _background.active = True
    _background.waited = 0.0
    try:
        return fn(**kwargs)
    except Exception:
        logger.exception("chat_background_job_failed job=%s", getattr(fn, "__name__", fn))
        return None
    finally:
        _background.active = False
        # Each job closes its connection: pool threads outlive the job by a long way.
        connections.close_all()


# Sends of this process on their way to their first token (chat/turn/service.py), by key: when
# each started. A background job is a thread of the same process: between its steps it waits
# for them (background_yield). Without it, a send while an import's first compaction ran (its
# extractive summary is ~0.1 s of Python per chunk) waited for the GIL at every hand-over, a 5
# ms switch interval each: 34 ms added before its first token against 18 for the send that
# started that compaction (bench ttft, SQLite).
_foreground: dict[object, float] = {}
# Held to change _foreground; background_yield waits on it (no polling: a thread waking every
# millisecond would itself take the GIL from the send).
_foreground_changed = threading.Condition()
# A send that has not reached its first token after this long (a slow model, a send that
# failed before its reply started) holds up nothing any more: a key never exited expires.
FOREGROUND_SECONDS = 1.0
# The longest one background_yield waits, and all of one job's waits together: a busy process
# (a send always on its way somewhere, or a flood of requests to the send route, which count
# from their arrival, before they are authenticated) delays a job by a second at most.
YIELD_MAX_SECONDS = 0.25
YIELD_JOB_SECONDS = 1.0
_background = threading.local()


def foreground_enter() -> object:
    """A send of this process is on its way to its first token, until foreground_exit(key)."""
    key = object()
    now = time.monotonic()
    with _foreground_changed:
        _expire(now)
        _foreground[key] = now
    return key


def foreground_exit(key: object) -> None:
    with _foreground_changed:
        _foreground.pop(key, None)
        if not _foreground:
            _foreground_changed.notify_all()


def background_yield() -> None:
    """Between the steps of a background job (background_submit): wait while a send of this
    process is on its way to its first token, up to YIELD_MAX_SECONDS, and YIELD_JOB_SECONDS
    for the whole job. Anywhere else (a compaction a send waits on, "compact now") it returns
    at once: that work is the send's."""
    if not _foreground or not getattr(_background, "active", False):
        return
    started = time.monotonic()
    left = min(YIELD_MAX_SECONDS, YIELD_JOB_SECONDS - _background.waited)
    try:
        with _foreground_changed:
            while _foreground:
                now = time.monotonic()
                _expire(now)
                if not _foreground:
                    return
                until = min(started + left, min(_foreground.values()) + FOREGROUND_SECONDS)
                if until <= now:
                    return
                _foreground_changed.wait(until - now)
    finally:
        _background.waited += time.monotonic() - started


def _expire(now: float) -> None:
    """Forget the sends that never reached their first token (held under the condition)."""
    for key, since in list(_foreground.items()):
        if now - since > FOREGROUND_SECONDS:
            del _foreground[key]


def background_submit(fn: Callable[..., Any], **kwargs: Any) -> Future[Any]:
    future = _executor.submit(_run, fn, kwargs)
    _pending.add(future)
    future.add_done_callback(_pending.discard)
    return future


class _Claims:
    """The keys whose job waits or runs in a pool: one job per key at a time. A key is
    released when its job ends (a done callback), not when the request that submitted it
    does: a client that left would otherwise free the place of a job still holding a thread."""

    def __init__(self) -> None:
        self._keys: set[object] = set()
        self._lock = threading.Lock()

    def claim(self, key: object, *, most: int | None = None) -> bool:
        """Whether `key` was free (and is now taken); not while `most` keys are taken."""
        with self._lock:
            if key in self._keys or (most is not None and len(self._keys) >= most):
                return False
            self._keys.add(key)
            return True

    def release(self, key: object) -> None:
        with self._lock:
            self._keys.discard(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._keys


# Reads that make a coming send cheaper (chat/search/recall_warm.py), on a thread of their own:
# behind a summary in the background pool they would come after the send they are for. One
# job per key at a time, WARM_QUEUE_MAX at most: a burst of page loads drops the rest (each
# send then does its own read, as it would have anyway).
_warmer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cadau-warm")
WARM_QUEUE_MAX = 8
_warming = _Claims()


def warm_submit(key: object, fn: Callable[..., Any], **kwargs: Any) -> Future[Any] | None:
    """`fn(**kwargs)` on the warming thread, unless a job of `key` is already waiting or
    running, or WARM_QUEUE_MAX are (None then)."""
    if not _warming.claim(key, most=WARM_QUEUE_MAX):
        return None
    try:
        future = _warmer.submit(_run, fn, kwargs)
    except RuntimeError:  # the pool shut down (the process is stopping)
        _warming.release(key)
        return None
    _pending.add(future)
    future.add_done_callback(_pending.discard)
    future.add_done_callback(lambda _: _warming.release(key))
    return future


def warm_waiting(key: object) -> bool:
    """Whether a job of `key` is waiting or running on the warming thread."""
    return key in _warming


# One thread of its own: embedding batches must not queue behind summaries (a new message would
# wait minutes for its vector), nor take the summaries' two threads.
_embedder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cadau-embed")


def embedding_submit(fn: Callable[..., Any], **kwargs: Any) -> Future[Any]:
    future = _embedder.submit(_run, fn, kwargs)
    _pending.add(future)
    future.add_done_callback(_pending.discard)
    return future


# A request that waits on a summarising model call ("compact now"): two at a time per process,
# the rest wait their turn. Not an HTTP thread (every page would queue behind a user's parallel
# compactions), not in_worker's pool (streaming replies' database steps would), not the
# background pool (it would queue behind summaries waiting for an idle one-slot model server).
_model_waits = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cadau-model-wait")
# Whose job is waiting or running there: one per user at a time. First come, first served
# over everyone, it let one user's parallel compactions of slow summaries hold both threads
# while another user's waited behind them (a probe: an instant compaction answered after 39 s
# behind four of someone else's).
_model_wait_owners = _Claims()


async def model_wait_run(fn: Callable[..., Any], *, owner: int, **kwargs: Any) -> Any:
    """`fn(**kwargs)` in the model-wait pool; its result, or its exception, to the caller.
    CompactionInProgress while a job of the same `owner` (a user id) waits or runs in this
    process."""
    if not _model_wait_owners.claim(owner):
        raise CompactionInProgress(
            "Another compaction of yours is still running: try again once it has ended."
        )

    def job() -> Any:
        close_old_connections()
        try:
            return fn(**kwargs)
        finally:
            connections.close_all()

    try:
        future = _model_waits.submit(job)
    except BaseException:
        _model_wait_owners.release(owner)
        raise
    future.add_done_callback(lambda _: _model_wait_owners.release(owner))
    return await asyncio.wrap_future(future)
