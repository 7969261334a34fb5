"""Sharing a model server that answers one request at a time.

llama.cpp's server runs one slot unless started with `--parallel`, and llama-cpp-python serves
one request at a time, ending the running stream when another arrives (docs/real-llm-notes.md).
On such a server a background compaction sent while a user's reply is due either makes the
reply wait behind a summary or cuts it off. With LLM_SERVER_SLOTS=1 background work yields to
replies, both ways:

- before each of its model calls it waits until no reply is in flight (or LLM_IDLE_WAIT_SECONDS
  pass: a summary must still happen on a server that is never idle);
- a call already running gives the server up the moment a reply starts: it is streamed
  (`complete` in chat/llm/openai_compat.py), its connection is shut from here when the reply
  starts in this process, and it checks between chunks for replies in other processes. A
  server ends the work of a request whose client left (llama-cpp-python even ends a running
  stream by itself when another request arrives), so the reply does not queue behind a summary
  (issue 25: first token after 130-219 s). The call raises `Preempted`; the compaction it was
  for changes nothing and happens on a later turn.

Replies never wait on this gate. Replies are counted in this process and, with
LLM_SERVER_SLOTS=1, in the cache shared by every server process (Redis with REDIS_URL), so a
compaction in one process also yields to a reply in another.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.cache import cache

logger = logging.getLogger("chat.llm")

_idle = threading.Condition()
_replies = 0
_local = threading.local()
# Background calls running in this process: each one's way to give up its connection at once.
_running: dict[int, Callable[[], None]] = {}
_running_lock = threading.Lock()

SHARED_KEY = "llm:replies-in-flight"
# A process that dies mid-reply leaves its count behind: it expires this long after the last
# reply started anywhere (a reply on a one-slot server takes seconds to minutes).
SHARED_TTL_SECONDS = 900
# Between chunks of a background call, other processes' replies are looked up this often.
SHARED_CHECK_SECONDS = 0.5
# While waiting for idle, how often other processes' replies are looked up.
_POLL_SECONDS = 0.25


def _one_slot() -> bool:
    return bool(settings.LLM_SERVER_SLOTS == 1)


def _shared_add(delta: int) -> None:
    """Count a reply in or out in the shared cache. A cache that fails only loses sight of
    other processes: never a reason to fail a reply."""
    try:
        if delta > 0:
            cache.add(SHARED_KEY, 0, SHARED_TTL_SECONDS)
            cache.incr(SHARED_KEY, delta)
            cache.touch(SHARED_KEY, SHARED_TTL_SECONDS)
        else:
            if cache.decr(SHARED_KEY, -delta) < 0:
                cache.set(SHARED_KEY, 0, SHARED_TTL_SECONDS)
    except ValueError:  # decr of a key that expired
        pass
    except Exception as exc:
        logger.warning("llm_slots_shared_count_failed error=%s", str(exc)[:200])


def shared_replies() -> int:
    """Replies in flight in every process, as the shared cache counts them."""
    try:
        return max(0, int(cache.get(SHARED_KEY) or 0))
    except Exception:
        return 0


def reply_started() -> None:
    global _replies
    with _idle:
        _replies += 1
    if _one_slot():
        _shared_add(1)
        with _running_lock:
            aborts = list(_running.values())
        for abort in aborts:
            abort()


def reply_ended() -> None:
    global _replies
    with _idle:
        _replies = max(0, _replies - 1)
        if _replies == 0:
            _idle.notify_all()
    if _one_slot():
        _shared_add(-1)


def replies_in_flight() -> bool:
    """A reply is being generated here or, on a one-slot server, in another process."""
    with _idle:
        if _replies:
            return True
    return _one_slot() and shared_replies() > 0


def idle_wait(*, timeout: float) -> bool:
    """Block until no reply is in flight (this process's, and on a one-slot server every
    process's), at most `timeout` seconds. True when it is idle."""
    deadline = time.monotonic() + timeout
    with _idle:
        if not _idle.wait_for(lambda: _replies == 0, timeout=timeout):
            return False
    while _one_slot() and shared_replies() > 0:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(_POLL_SECONDS, left))
        with _idle:
            if not _idle.wait_for(
                lambda: _replies == 0, timeout=max(0.0, deadline - time.monotonic())
            ):
                return False
    return True


@contextmanager
def background(*, timeout: float) -> Iterator[None]:
    """Marks this thread's model calls as background work that yields to replies: each one
    (`background_turn`) first waits for no reply in flight, at most `timeout` seconds. Not only
    the first: a compaction makes several calls (a retry, a shortening), and one sent while a
    reply streams would cut the reply off on a server that interrupts."""
    previous = getattr(_local, "timeout", None)
    _local.timeout = timeout
    try:
        yield
    finally:
        _local.timeout = previous


def in_background() -> bool:
    """This thread's model calls are background work on a one-slot server."""
    return getattr(_local, "timeout", None) is not None and _one_slot()


def background_turn() -> bool:
    """Called before each model call: in background work, wait for the replies to end. True
    when the call may go (idle, or not background work); False when it waited its whole
    timeout (it goes anyway: a summary must happen on a server that is never idle)."""
    timeout = getattr(_local, "timeout", None)
    return True if timeout is None else idle_wait(timeout=timeout)


@contextmanager
def yielding(abort: Callable[[], None]) -> Iterator[Callable[[], bool]]:
    """Around one background call: `abort` is called (from the reply's thread) the moment a
    reply starts in this process. Yields a check for the call to make between its chunks: True
    when a reply anywhere wants the server."""
    key = id(abort)
    with _running_lock:
        _running[key] = abort
    checked = [time.monotonic(), False]

    def reply_waiting() -> bool:
        with _idle:
            if _replies:
                return True
        now = time.monotonic()
        if _one_slot() and now - checked[0] >= SHARED_CHECK_SECONDS:
            checked[0], checked[1] = now, shared_replies() > 0
        return bool(checked[1])

    try:
        yield reply_waiting
    finally:
        with _running_lock:
            _running.pop(key, None)
