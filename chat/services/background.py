"""Work that must not hold up a request: compaction after a reply. A small bounded pool, so a
burst of replies cannot start a thread storm; each job closes its DB connection when done."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from django.db import close_old_connections, connections

logger = logging.getLogger("chat.background")

_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cadau-bg")
_pending: set[Future[Any]] = set()


def _run(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    close_old_connections()
    try:
        return fn(**kwargs)
    except Exception:
        logger.exception("chat_background_job_failed job=%s", getattr(fn, "__name__", fn))
        return None
    finally:
        connections.close_all()


def background_submit(fn: Callable[..., Any], **kwargs: Any) -> Future[Any]:
    future = _executor.submit(_run, fn, kwargs)
    _pending.add(future)
    future.add_done_callback(_pending.discard)
    return future


def background_wait(timeout: float = 30.0) -> None:
    """Tests and graceful shutdown: wait for the jobs submitted so far."""
    wait(list(_pending), timeout=timeout)
