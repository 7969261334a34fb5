"""WebSocket helpers for tests that drive the consumer through the real ASGI application
(origin check, Django session auth, routing) with channels' WebsocketCommunicator, as
the tests in tests/chat/consumers/ do. Import `loop_left_clean` into a test module that streams
replies over sockets (it is autouse there)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from cadau.asgi import application
from chat.services import sockets
from chat.turn import service
from tests.helpers import loop_transports_close

ORIGIN = b"http://localhost"
TIMEOUT = 5.0


@pytest.fixture(autouse=True)
async def loop_left_clean():
    """Replies outlive their sockets on purpose, and the test's loop ends with the test: let
    them finish first (a reply cut off with its loop would leave channels-redis mid-receive,
    and the next test's receive would fail). The ASGI application marks the test's loop as a
    server's, so replies stream through a pooled transport on it: close that too.
    channels-redis keeps receive state (a lock, a count) for the loop that receives; a socket
    task still waiting when the loop ends would leave it to the next test's loop, so each test
    gets a layer of its own, as each server process has."""
    yield
    if service._tasks:
        tasks = list(service._tasks)
        _done, pending = await asyncio.wait(tasks, timeout=TIMEOUT)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    await loop_transports_close()
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
    # A test that failed with sockets open never disconnected them: their registrations
    # (chat/services/sockets.py) would count against the next test's user of the same id.
    with sockets._lock:
        sockets._open.clear()


def login_cookie(user: Any) -> str:
    """A fresh browser login of `user`: its session key (the `sessionid` cookie)."""
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def socket_for(session_id: Any, cookie: str) -> WebsocketCommunicator:
    headers = [
        (b"host", b"localhost"),
        (b"origin", ORIGIN),
        (b"cookie", f"sessionid={cookie}".encode()),
    ]
    return WebsocketCommunicator(application, f"/ws/chat/{session_id}/", headers=headers)


async def ws_open(session_id: Any, cookie: str) -> WebsocketCommunicator:
    ws = socket_for(session_id, cookie)
    connected, code = await ws.connect(timeout=TIMEOUT)
    assert connected, code
    return ws


async def until(ws: WebsocketCommunicator, kind: str, *, timeout: float = TIMEOUT) -> list[dict]:
    """Events up to and including the first of type `kind`."""
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    while True:
        event = await ws.receive_json_from(timeout=max(deadline - time.monotonic(), 0.01))
        events.append(event)
        if event["type"] == kind:
            return events


async def closed_with(ws: WebsocketCommunicator, *, timeout: float = TIMEOUT) -> tuple[int, list]:
    """Wait for the server to close the socket: its close code, and the events sent before."""
    before: list = []
    deadline = time.monotonic() + timeout
    while True:
        output = await ws.receive_output(timeout=max(deadline - time.monotonic(), 0.01))
        if output["type"] == "websocket.close":
            return output.get("code", 1000), before
        before.append(json.loads(output["text"]) if "text" in output else output)


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))
