"""One thread that writes the paced token chunks of every stream of the fake LLM server."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class _PacedStream:
    emit: Any  # piece -> None; raises _ClientGone
    pieces: list[Any]
    interval: float
    done: threading.Event = field(default_factory=threading.Event)
    sent: int = 0
    error: BaseException | None = None


class Pacer:
    """Writes the paced token chunks of every stream from one thread.

    Why: with a thread per stream sleeping `token_ms` between writes, 200 streams at 20 ms are
    10,000 thread wake-ups a second contending for the GIL, ~45% of a core for this stand-in
    alone, on the machine whose CPU the realtime benchmark measures. One thread walking a
    schedule makes the same writes, on time (no drift from sleep + write), for a fraction of
    that. The handler thread waits until its stream is written. Streams with a fault keep the
    handler's own loop: faults block or cut mid-stream and are rare."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, _PacedStream]] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def run(self, *, emit: Any, pieces: list[Any], interval: float) -> None:
        """Emit pieces[0] now and each next one `interval` later; return when all are out.
        Raises what `emit` raised (the client went away)."""
        stream = _PacedStream(emit=emit, pieces=pieces, interval=interval)
        with self._cv:
            heapq.heappush(self._due, (time.monotonic(), next(self._seq), stream))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="fakellm-pacer")
                self._thread.daemon = True
                self._thread.start()
            self._cv.notify()
        stream.done.wait()
        if stream.error is not None:
            raise stream.error

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._due:
                    self._cv.wait()
                due, _, stream = self._due[0]
                delay = due - time.monotonic()
                if delay > 0:
                    self._cv.wait(delay)
                    continue
                heapq.heappop(self._due)
            try:
                stream.emit(stream.pieces[stream.sent])
            except Exception as exc:  # the client is gone: its handler re-raises
                stream.error = exc
                stream.done.set()
                continue
            stream.sent += 1
            if stream.sent == len(stream.pieces):
                stream.done.set()
                continue
            with self._cv:
                heapq.heappush(self._due, (due + stream.interval, next(self._seq), stream))
