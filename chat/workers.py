"""Where sync work runs when it must not hold up its caller.

- `in_worker(fn)`: async code (a reply, a socket) awaiting sync service work in the thread pool.
- `background_submit(fn, **kwargs)`: work nobody awaits (compaction after a reply) in a small
  bounded pool, so a burst of replies cannot start a thread storm.
- `model_wait_run(fn, **kwargs)`: a request awaiting a summarising model call ("compact now").
- `embedding_submit(fn, **kwargs)`: the background embedder (semantic recall), on its own thread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from channels.db import database_sync_to_async
from django.db import close_old_connections, connections

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
    try:
        return fn(**kwargs)
    except Exception:
        logger.exception("chat_background_job_failed job=%s", getattr(fn, "__name__", fn))
        return None
    finally:
        # Each job closes its connection: pool threads outlive the job by a long way.
        connections.close_all()


def background_submit(fn: Callable[..., Any], **kwargs: Any) -> Future[Any]:
    future = _executor.submit(_run, fn, kwargs)
    _pending.add(future)
    future.add_done_callback(_pending.discard)
    return future


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


async def model_wait_run(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """`fn(**kwargs)` in the model-wait pool; its result, or its exception, to the caller."""

    def job() -> Any:
        close_old_connections()
        try:
            return fn(**kwargs)
        finally:
            connections.close_all()

    return await asyncio.wrap_future(_model_waits.submit(job))
