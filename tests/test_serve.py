"""cadau/serve.py: Daphne with its reactor on uvloop. The servers the tests start (scale-out,
browser) and the benchmark run through it, so this only pins the loop it picks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client

from bench.procs import ServerProcess, app_env, database_url
from tests.factories import ChatSessionFactory

ROOT = Path(__file__).resolve().parent.parent


def test_daphnes_reactor_runs_on_uvloop():
    probe = "import cadau.serve, daphne.server; print(type(daphne.server.twisted_loop).__module__)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().startswith("uvloop")


def test_the_launcher_takes_daphnes_options():
    out = subprocess.run(
        [sys.executable, "-m", "cadau.serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--fd" in out.stdout and "--proxy-headers" in out.stdout


def test_the_application_is_loaded_whole_and_frozen_out_of_the_collectors_sight():
    """cadau/asgi.py imports every view and freezes what is loaded: a full garbage collection
    then walks only what requests made since, not the ~140k objects of the loaded code."""
    probe = (
        "import gc, sys; import cadau.asgi; "
        "print(gc.get_freeze_count(), 'chat.api.send' in sys.modules, len(gc.get_objects()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    frozen, views_loaded, tracked = out.stdout.split()
    assert views_loaded == "True"
    assert int(frozen) > 50_000
    assert int(tracked) < int(frozen) // 10


# --- a real server process: limits at Daphne's level ---------------------------------------------


@pytest.fixture
def daphne(transactional_db, tmp_path) -> Iterator[ServerProcess]:
    """`python -m cadau.serve` on this test's database (SQLite file or PostgreSQL), with the
    in-memory channel layer and the default limits."""
    env = app_env(
        database_url(connection.settings_dict),
        SECRET_KEY=django_settings.SECRET_KEY,
        RUNTIME_DIR=str(tmp_path / "runtime"),
        CHAT_BACKGROUND_COMPACTION="false",
        WS_MAX_FRAMES_PER_MINUTE="120",
    )
    env.pop("LLM_BASE_URL", None)
    server = ServerProcess.app(env=env, log_path=tmp_path / "daphne.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _socket(server: ServerProcess, user: Any) -> Any:
    session: Any = ChatSessionFactory(owner=user)
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    return websockets.connect(
        f"ws://127.0.0.1:{server.port}/ws/chat/{session.pk}/",
        additional_headers={"Cookie": f"sessionid={cookie}", "Origin": server.url},
        max_size=None,
        open_timeout=10,
    )


async def _answer(ws: Any) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


async def test_frames_over_daphnes_default_get_the_apps_own_answers(daphne, owner):
    """Before: Daphne's 1 MiB message limit closed the socket (1009) on both frames."""
    cap = django_settings.WS_MAX_FRAME_BYTES
    async with await asyncio.to_thread(_socket, daphne, owner) as ws:
        # 1.5 MiB: within the app's frame cap, over its message cap (runes).
        await ws.send(json.dumps({"type": "send", "content": "x" * (3 * 512 * 1024)}))
        assert (await _answer(ws))["code"] == "message_too_large"
        # Just over the frame cap: the app's bad_request, and the socket stays open.
        await ws.send(json.dumps({"type": "send", "content": "x" * cap}))
        error = await _answer(ws)
        assert error["code"] == "bad_request" and str(cap) in error["message"]
        await ws.send(json.dumps({"type": "cancel"}))
        assert (await _answer(ws))["code"] == "nothing_to_cancel"
    # Far over it: Daphne's to refuse, and it ends the connection.
    ws = await (await asyncio.to_thread(_socket, daphne, owner))
    with contextlib.suppress(websockets.ConnectionClosed, ConnectionResetError):
        await ws.send("x" * (cap + 2 * 1024 * 1024))
        await asyncio.wait_for(ws.recv(), 10)
    with contextlib.suppress(websockets.ConnectionClosed, ConnectionResetError):
        await ws.close()
    # With a closing handshake: before, a dropped connection (1006, the reset first).
    assert ws.close_code == 1009


def _raw_request(server: ServerProcess, head: bytes) -> tuple[int, dict[str, Any]]:
    """Send `head` as is (httpx refuses URLs over 64 KiB) and read the answer to its end."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        with contextlib.suppress(ConnectionError):
            raw.sendall(head)
        reply = b""
        while chunk := raw.recv(65536):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body)


def test_a_long_query_string_is_a_json_414(daphne):
    """Before: the connection was closed without a reply."""
    for query_bytes in (20_000, 150_000, 2**21):
        target = f"/api/v1/chat/search?q={'a' * query_bytes}".encode()
        head = b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        status, body = _raw_request(daphne, head)
        assert status == 414 and body["error"]["code"] == "uri_too_long", query_bytes
    assert daphne.log_tail().count('"- -" 414') == 3, daphne.log_tail()


def test_a_body_announced_over_the_cap_is_a_json_413_before_it_is_read(daphne):
    """Before: Twisted waited for the whole body (a length no client sends: until the
    connection timed out, unanswered; 200 MB: read, then refused)."""
    cap = django_settings.HTTP_MAX_BODY_BYTES
    for length in (cap + 1, 10**20):
        head = (
            b"POST /api/v1/chat/send HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n{" % length
        )
        started = time.monotonic()
        status, body = _raw_request(daphne, head)
        assert status == 413 and body["error"]["code"] == "request_too_large", length
        assert str(cap) in body["error"]["message"]
        assert time.monotonic() - started < 5
    # Chunked: refused once what arrived is over the cap, not once all of it is in.
    with socket.create_connection(("127.0.0.1", daphne.port), timeout=10) as raw:
        raw.sendall(
            b"POST /api/v1/chat/send HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"x" * 65536
        reply = b""
        with contextlib.suppress(ConnectionError):
            for _ in range(cap // len(chunk) + 2):
                raw.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            raw.settimeout(5)
            while part := raw.recv(65536):
                reply += part
    assert reply.startswith(b"HTTP/1.1 413") and b'"request_too_large"' in reply, reply[:300]
    # In the access log with every other answer (Daphne's request, which writes the lines,
    # never saw these).
    assert daphne.log_tail().count('"POST /api/v1/chat/send" 413') == 3, daphne.log_tail()
    # Under the cap, the body is read and handed on: the app's own answer (no login here).
    assert httpx.post(f"{daphne.url}/api/v1/chat/send", content=b"x" * 10).status_code == 403
    chunks = iter([b"x" * 1000] * 5)  # a chunked body under the cap: handed on too
    assert httpx.post(f"{daphne.url}/api/v1/chat/send", content=chunks).status_code == 403


def test_oversized_headers_are_a_json_431_and_bad_http_a_json_400(daphne):
    response = httpx.get(f"{daphne.url}/api/v1/status", headers={"X-Big": "a" * 20_000})
    assert response.status_code == 431
    assert response.json()["error"]["code"] == "headers_too_large"
    # Many headers that add up: the same refusal.
    many = {f"X-H{n}": "a" * 1000 for n in range(20)}
    response = httpx.get(f"{daphne.url}/api/v1/status", headers=many)
    assert response.status_code == 431
    with socket.create_connection(("127.0.0.1", daphne.port), timeout=10) as raw:
        raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        reply = raw.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400") and b'"bad_request"' in reply
    # Ordinary requests are untouched.
    assert httpx.get(f"{daphne.url}/api/v1/status").status_code == 403


def test_a_head_sends_no_body_and_the_connection_stays_usable(daphne, owner):
    """Daphne wrote every body chunk but the first after a HEAD's headers: a streamed export
    (and any body over 64 KiB) went onto the connection where the next response belongs."""
    from rest_framework.authtoken.models import Token

    from chat.models import ChatMessage

    session: Any = ChatSessionFactory(owner=owner)
    big = "€" * 60_000  # over Django's 64 KiB chunk once encoded
    for n in range(3):
        ChatMessage.objects.create(session=session, role="user", content=f"{n} {big}")
    key = Token.objects.create(user=owner).key
    auth = f"Authorization: Token {key}\r\nHost: 127.0.0.1\r\n".encode()
    targets = [
        f"/api/v1/chat/sessions/{session.pk}/export".encode(),
        f"/api/v1/chat/history?session_id={session.pk}&limit=3".encode(),
    ]
    for target in targets:
        with socket.create_connection(("127.0.0.1", daphne.port), timeout=10) as raw:
            raw.sendall(b"HEAD " + target + b" HTTP/1.1\r\n" + auth + b"\r\n")
            raw.sendall(b"GET /api/v1/status HTTP/1.1\r\n" + auth + b"Connection: close\r\n\r\n")
            reply = b""
            with contextlib.suppress(TimeoutError):
                while part := raw.recv(65536):
                    reply += part
        head, _, rest = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), (target, reply[:300])
        # What follows the HEAD's headers is the next response, not a byte of the body.
        assert rest.startswith(b"HTTP/1.1 200"), (target, rest[:200])
        assert b"\xe2\x82\xac" not in rest  # no "€" of the messages


async def test_a_frame_flood_is_closed_without_tracebacks(daphne, owner):
    """A client that floods frames is closed with 4429; one that floods and drops the
    connection leaves its frames unanswered. Before: the frames still queued were answered
    into the closed protocol, each answer a logged "Attempt to send on a closed protocol"
    traceback."""
    frame = json.dumps({"type": "cancel"})
    async with await asyncio.to_thread(_socket, daphne, owner) as ws:
        with contextlib.suppress(websockets.ConnectionClosed):
            for _ in range(1000):
                await ws.send(frame)
        with contextlib.suppress(websockets.ConnectionClosed):
            async with asyncio.timeout(20):
                while True:
                    await ws.recv()
        assert ws.close_code == 4429
    for _ in range(3):
        ws = await (await asyncio.to_thread(_socket, daphne, owner))
        for _ in range(110):  # under the rate limit: every one is answered
            await ws.send(frame)
        ws.transport.abort()  # gone, without a close frame, its frames still queued
    await asyncio.sleep(2.0)
    log = daphne.log_path.read_text()
    assert "closed protocol" not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.django_db(transaction=True)
def test_the_launcher_sweeps_replies_a_killed_process_left_before_serving(owner):
    """`python -m cadau.serve` runs the crash sweep, as `make run` runs sweep_streaming."""
    from datetime import timedelta

    from django.utils import timezone

    import cadau.serve
    from chat.models import ChatMessage, MessageStatus
    from tests.factories import ChatSessionFactory

    session = ChatSessionFactory(owner=owner)
    stuck = ChatMessage.objects.create(
        session=session, role="assistant", content="half", status=MessageStatus.STREAMING
    )
    ChatMessage.objects.filter(pk=stuck.pk).update(
        updated_at=timezone.now() - timedelta(minutes=10)
    )
    assert cadau.serve.startup_sweep() == 1
    stuck.refresh_from_db()
    assert stuck.status == MessageStatus.FAILED and stuck.content == "half"
