"""The load generator of `python -m bench realtime`: WebSocket clients that send turns and time
every delta against the fake model's emit stamp, and the sampler of the servers' RSS."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(kw_only=True)
class RunResult:
    clients: int
    expected: int = 0
    connected: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    # Per delta: receive time (time.time()), for the "all streaming" window.
    received_at: list[float] = field(default_factory=list)
    # Per reply: (first delta received, done received), time.time(); for the concurrency figures.
    streams: list[tuple[float, float]] = field(default_factory=list)
    # Per reply: send -> first delta received, ms (includes the fake model's first token).
    first_delta_ms: list[float] = field(default_factory=list)
    replies: int = 0
    failed: int = 0
    wall_s: float = 0.0
    rss_idle_mb: float = 0.0
    rss_peak_mb: float = 0.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _RssSampler:
    """Peak of the summed RSS of the server processes."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(rss_mb(pid) for pid in self.pids))
            self._stop.wait(0.1)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def _turns(
    *, port: int, session_id: int, cookie: str, turns: int, start: asyncio.Event, out: RunResult
) -> None:
    import websockets

    url = f"ws://127.0.0.1:{port}/ws/chat/{session_id}/"
    headers = {"Cookie": f"sessionid={cookie}", "Origin": f"http://127.0.0.1:{port}"}
    async with websockets.connect(url, additional_headers=headers, open_timeout=60) as ws:
        out.connected += 1
        await start.wait()
        for turn in range(turns):
            frame = {"type": "send", "content": f"bench turn {turn}", "client_id": uuid.uuid4().hex}
            sent = time.time()
            first = 0.0
            await ws.send(json.dumps(frame))
            while True:
                raw = await asyncio.wait_for(ws.recv(), timeout=120)
                received = time.time()  # before parsing: parsing is the client's, not the app's
                event = json.loads(raw)
                if event["type"] == "delta" and "emitted_at" in event:
                    out.latencies_ms.append((received - event["emitted_at"]) * 1000.0)
                    out.received_at.append(received)
                    if not first:
                        first = received
                        out.first_delta_ms.append((first - sent) * 1000.0)
                elif event["type"] == "done":
                    if first:
                        out.streams.append((first, received))
                    out.replies += 1
                    if event["message"]["status"] != "complete":
                        out.failed += 1
                    break
                elif event["type"] == "error":
                    out.failed += 1


async def run_clients(
    *, port: int, pids: list[int], sessions: list[int], cookie: str, turns: int
) -> RunResult:
    result = RunResult(clients=len(sessions), expected=len(sessions) * turns)
    start = asyncio.Event()
    tasks = [
        asyncio.ensure_future(
            _turns(port=port, session_id=s, cookie=cookie, turns=turns, start=start, out=result)
        )
        for s in sessions
    ]
    # All sockets open before anyone sends: the idle RSS is "N sockets connected".
    deadline = time.monotonic() + 120
    while result.connected < len(sessions) and time.monotonic() < deadline:
        if any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    result.rss_idle_mb = sum(rss_mb(pid) for pid in pids)
    with _RssSampler(pids) as sampler:
        started = time.monotonic()
        start.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        result.wall_s = time.monotonic() - started
    result.rss_peak_mb = sampler.peak
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        log(f"  {len(errors)} client(s) failed, first: {errors[0]!r}")
        result.failed += len(errors)
    return result


def client_run(coro: Any) -> RunResult:
    """Run the load generator on uvloop when it is there: the client shares the machine with
    the server under test, so the less CPU it takes per frame the less it skews the figures."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
