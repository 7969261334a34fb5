"""The load of `python -m bench faults`: per session one sender (WebSocket or REST with
server-sent events, alternately) and one watcher socket on another server process, and what
each saw. A sender retries a send that got no answer with the same client_id (idempotent), on
the next process when its own is gone; a watcher reconnects, and catches up through the
history API as the page does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_SECONDS = 1.0
MAX_TRIES = 30
REPLY_TIMEOUT = 60.0
# Watchers stay on after the last send: the replies' ends, a dead process's lease, catch-ups.
WATCH_AFTER_SECONDS = 20.0


def _loop_time_of(monotonic_at: float) -> float:
    """asyncio's clock for a time.monotonic() instant."""
    return asyncio.get_running_loop().time() + (monotonic_at - time.monotonic())


@dataclass(kw_only=True)
class Target:
    session_id: int
    cookie: str
    token: str
    sender_port: int
    watcher_port: int
    transport: str  # "ws" or "sse"


@dataclass
class Counts:
    attempted: set[str] = field(default_factory=set)
    acknowledged: set[str] = field(default_factory=set)
    streams_silent: int = 0  # ended cleanly with neither done nor error
    streams_cut: int = 0  # the connection was lost (a killed process): retried
    rest_500: int = 0
    rest_503: int = 0
    refused: int = 0  # sockets refused (4429) or failed to connect after the faults ended
    # session id -> when its sends were acknowledged (time.monotonic())
    acks: dict[int, list[float]] = field(default_factory=dict)
    # watcher: reply id -> (text assembled from its events, got done)
    watched: dict[int, dict[str, Any]] = field(default_factory=dict)


class Load:
    def __init__(self, *, ports: list[int], alive: set[int], counts: Counts) -> None:
        self.ports = ports
        self.alive = alive  # the ports of processes not killed
        self.counts = counts
        self.stop_at = 0.0
        self.fault_at = 0.0
        self.faults_over = asyncio.Event()

    def _next_port(self, port: int) -> int:
        live = [p for p in self.ports if p in self.alive] or self.ports
        return port if port in live else live[(self.ports.index(port)) % len(live)]

    # --- senders --------------------------------------------------------------------------

    async def sender(self, target: Target) -> None:
        n = 0
        sent_after_fault = False
        # Past the end, one send started after the fault still goes: how long a session of a
        # killed process takes to take a new one is measured on it.
        while time.monotonic() < self.stop_at or (self.fault_at and not sent_after_fault):
            if self.fault_at and time.monotonic() > self.fault_at:
                sent_after_fault = True
            client_id = uuid.uuid4().hex
            content = f"fault-bench {target.session_id} {n} {client_id}"
            n += 1
            self.counts.attempted.add(client_id)
            for _ in range(MAX_TRIES):
                port = self._next_port(target.sender_port)
                send = self._send_ws if target.transport == "ws" else self._send_sse
                try:
                    if await send(target, port, content, client_id):
                        break
                except (TimeoutError, OSError, httpx.HTTPError, EOFError) as exc:
                    del exc
                    self.counts.streams_cut += 1
                except Exception:  # websockets' ConnectionClosed and the like
                    self.counts.streams_cut += 1
                await asyncio.sleep(RETRY_SECONDS)

    def _ack(self, target: Target, client_id: str) -> None:
        if client_id in self.counts.acknowledged:
            return  # a retry's repeat: the send was taken before
        self.counts.acknowledged.add(client_id)
        self.counts.acks.setdefault(target.session_id, []).append(time.monotonic())

    async def _send_sse(self, target: Target, port: int, content: str, client_id: str) -> bool:
        """True when the reply ended (done, or a reply failure's error); False to retry."""
        body = {"session_id": target.session_id, "content": content, "client_id": client_id}
        headers = {"Authorization": f"Token {target.token}", "Accept": "text/event-stream"}
        url = f"http://127.0.0.1:{port}/api/v1/chat/send"
        async with (
            httpx.AsyncClient(timeout=REPLY_TIMEOUT) as client,
            client.stream("POST", url, json=body, headers=headers) as response,
        ):
            if response.status_code != 200:
                if response.status_code == 500:
                    self.counts.rest_500 += 1
                elif response.status_code == 503:
                    self.counts.rest_503 += 1
                return False
            ended = False
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                kind = event.get("type")
                if kind == "message" and (event["message"].get("client_id") == client_id):
                    self._ack(target, client_id)
                elif kind in ("done", "error"):
                    ended = True
                    if kind == "done":
                        return True
            if not ended:
                self.counts.streams_silent += 1
            return ended

    async def _send_ws(self, target: Target, port: int, content: str, client_id: str) -> bool:
        import websockets

        url = f"ws://127.0.0.1:{port}/ws/chat/{target.session_id}/"
        headers = {"Cookie": f"sessionid={target.cookie}", "Origin": f"http://127.0.0.1:{port}"}
        async with websockets.connect(url, additional_headers=headers, open_timeout=20) as ws:
            await ws.send(json.dumps({"type": "send", "content": content, "client_id": client_id}))
            mine: int | None = None
            async with asyncio.timeout(REPLY_TIMEOUT):
                async for raw in ws:
                    event = json.loads(raw)
                    kind = event.get("type")
                    message = event.get("message") or {}
                    if kind == "message" and message.get("client_id") == client_id:
                        self._ack(target, client_id)
                        mine = message["id"]
                    elif kind == "done" and mine is not None:
                        if (message.get("metadata") or {}).get("reply_to") == mine:
                            return True
                    elif kind == "error" and event.get("code") in (
                        "reply_in_progress",
                        "throttled",
                    ):
                        return False
        self.counts.streams_silent += 1
        return False

    # --- watchers -------------------------------------------------------------------------

    async def watcher(self, target: Target) -> None:
        import websockets

        end = self.stop_at + WATCH_AFTER_SECONDS
        while time.monotonic() < end:
            port = self._next_port(target.watcher_port)
            url = f"ws://127.0.0.1:{port}/ws/chat/{target.session_id}/"
            headers = {
                "Cookie": f"sessionid={target.cookie}",
                "Origin": f"http://127.0.0.1:{port}",
            }
            try:
                ws = await websockets.connect(url, additional_headers=headers, open_timeout=20)
            except Exception:
                # Refused by a live process (4429 too_many_sockets, a failed handshake).
                if self.faults_over.is_set():
                    self.counts.refused += 1
                await asyncio.sleep(0.5)
                continue
            try:
                async with ws:
                    await self._catch_up(target, port)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout_at(_loop_time_of(end)):
                            async for raw in ws:
                                self._watched(json.loads(raw))
                    if ws.close_code == 4429:
                        self.counts.refused += 1
            except Exception:  # dropped (its process was killed): connect again
                pass
            await asyncio.sleep(0.5)

    def _watched(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "delta":
            seen = self.counts.watched.setdefault(event["message_id"], {"text": "", "done": False})
            text, offset = seen["text"], event["offset"]
            if offset > len(text):
                seen["gap"] = True
            seen["text"] = text[:offset] + event["text"]
        elif kind in ("message", "done"):
            message = event["message"]
            if message.get("role") != "assistant":
                return
            seen = self.counts.watched.setdefault(message["id"], {"text": "", "done": False})
            if kind == "done" and seen["text"] and message.get("status") == "complete":
                # What the deltas built must be the stored text (a lost piece is not).
                # Held back (a prefix) is not wrong: the text shown so far, then `done`'s.
                seen["mismatch"] = not message["content"].startswith(seen["text"])
            seen["text"] = message["content"]
            if kind == "done" or message.get("status") != "streaming":
                seen["done"] = True

    async def _catch_up(self, target: Target, port: int) -> None:
        """As the page does after a reconnect: the newest page of the history."""
        url = f"http://127.0.0.1:{port}/api/v1/chat/history"
        with contextlib.suppress(Exception):
            async with httpx.AsyncClient(timeout=20) as client:
                response = await client.get(
                    url,
                    params={"session_id": target.session_id, "limit": 50},
                    headers={"Authorization": f"Token {target.token}"},
                )
                for message in response.json()["messages"]:
                    self._watched({"type": "message", "message": message})
