"""Sharing a model server that answers one request at a time.

llama.cpp's server runs one slot unless started with `--parallel`, and llama-cpp-python serves
one request at a time, ending the running stream when another arrives (docs/real-llm-notes.md).
On such a server a background compaction sent while a user's reply is due either makes the
reply wait behind a summary or cuts it off. With LLM_SERVER_SLOTS=1 the background summary
waits here until this process has no reply in flight (or LLM_IDLE_WAIT_SECONDS pass: a summary
must still happen on a server that is never idle). Replies never wait on this gate.

Counted per process: replies another server process is generating are not seen.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_idle = threading.Condition()
_replies = 0
_local = threading.local()


def reply_started() -> None:
    global _replies
    with _idle:
        _replies += 1


def reply_ended() -> None:
    global _replies
    with _idle:
        _replies = max(0, _replies - 1)
        if _replies == 0:
            _idle.notify_all()


def idle_wait(*, timeout: float) -> bool:
    """Block until no reply is in flight in this process, at most `timeout` seconds. True when
    it is idle."""
    with _idle:
        return _idle.wait_for(lambda: _replies == 0, timeout=timeout)


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


def background_turn() -> bool:
    """Called before each model call: in background work, wait for this process's replies to
    end. True when the call may go (idle, or not background work); False when it waited its
    whole timeout (it goes anyway: a summary must happen on a server that is never idle)."""
    timeout = getattr(_local, "timeout", None)
    return True if timeout is None else idle_wait(timeout=timeout)
