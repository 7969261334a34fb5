"""cadau/compression.py: pages and JSON gzipped, static files as Brotli or gzip from cached
copies, and the event stream never compressed."""

from __future__ import annotations

import gzip
from pathlib import Path

import brotli
import pytest
from django.test import Client

from cadau.compression import compressed_copies
from chat.models import ChatMessage, ChatSession, MessageRole
from tests.helpers import sse_events

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def web(owner) -> Client:
    client = Client()
    client.force_login(owner)
    return client


@pytest.fixture(scope="module")
def compressed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One per module: the first request compresses every static file once (a few seconds).
    return tmp_path_factory.mktemp("compressed")


@pytest.fixture(autouse=True)
def _compressed_dir(settings, compressed_dir: Path) -> None:
    settings.STATIC_COMPRESSED_DIR = compressed_dir


@pytest.mark.django_db
def test_the_page_is_gzipped_for_a_browser_that_takes_it(web: Client, owner) -> None:
    session = ChatSession.objects.create(owner=owner)
    plain = web.get(f"/chat/{session.pk}/")
    packed = web.get(f"/chat/{session.pk}/", HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert "Content-Encoding" not in plain
    assert packed["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in packed["Vary"]
    page = gzip.decompress(packed.content)
    assert b'id="cadau-config"' in page and len(packed.content) < len(page) / 2
    # The CSP is still on the compressed page.
    assert "script-src 'self'" in packed["Content-Security-Policy"]


@pytest.mark.django_db
def test_json_is_gzipped(api, owner) -> None:
    session = ChatSession.objects.create(owner=owner)
    ChatMessage.objects.bulk_create(
        ChatMessage(session=session, role=MessageRole.USER, content=f"message {i} " * 20)
        for i in range(30)
    )
    r = api.get(
        "/api/v1/chat/history",
        {"session_id": session.pk, "render": "html"},
        HTTP_ACCEPT_ENCODING="gzip",
    )
    assert r.status_code == 200 and r["Content-Encoding"] == "gzip"
    assert b'"messages"' in gzip.decompress(r.content)


@pytest.mark.django_db(transaction=True)
def test_the_event_stream_is_never_compressed(api, owner, fake_llm) -> None:
    session = ChatSession.objects.create(owner=owner)
    fake_llm.script("one two three " * 50)
    r = api.post(
        "/api/v1/chat/send",
        {"session_id": session.pk, "content": "stream please"},
        format="json",
        HTTP_ACCEPT="text/event-stream",
        HTTP_ACCEPT_ENCODING="gzip, br",
    )
    assert r.status_code == 200 and r["Content-Type"].startswith("text/event-stream")
    assert "Content-Encoding" not in r
    events = sse_events(r)
    assert events[-1]["type"] == "done"
    assert ChatSession.objects.get(pk=session.pk).message_count == 2


@pytest.mark.django_db
@pytest.mark.parametrize(("accept", "encoding"), [("br, gzip", "br"), ("gzip", "gzip")])
def test_static_files_come_compressed(accept: str, encoding: str) -> None:
    source = (ROOT / "static" / "chat" / "app.js").read_bytes()
    r = Client().get("/static/chat/app.js", HTTP_ACCEPT_ENCODING=accept)
    assert r.status_code == 200 and r["Content-Encoding"] == encoding
    body = r.getvalue()
    unpacked = brotli.decompress(body) if encoding == "br" else gzip.decompress(body)
    assert unpacked == source and len(body) < len(source) / 2
    plain = Client().get("/static/chat/app.js")
    assert "Content-Encoding" not in plain and plain.getvalue() == source


def test_copies_follow_the_content_and_skip_what_does_not_shrink(tmp_path) -> None:
    cache = tmp_path / "cache"
    script = tmp_path / "a.js"
    script.write_text("const answer = 42;\n" * 200)
    first = compressed_copies(path=str(script), cache_dir=cache)
    assert set(first) == {"br", "gzip"}
    assert brotli.decompress(Path(first["br"]).read_bytes()) == script.read_bytes()
    # Edited: new copies, never the stale ones.
    script.write_text("let answer = 43;\n" * 200)
    second = compressed_copies(path=str(script), cache_dir=cache)
    assert second["gzip"] != first["gzip"]
    assert gzip.decompress(Path(second["gzip"]).read_bytes()) == script.read_bytes()
    # Unchanged: the same copies again.
    assert compressed_copies(path=str(script), cache_dir=cache) == second
    picture = tmp_path / "a.png"
    picture.write_bytes(b"\x89PNG" * 100)
    assert compressed_copies(path=str(picture), cache_dir=cache) == {}
    tiny = tmp_path / "b.css"
    tiny.write_text("a{}")
    assert compressed_copies(path=str(tiny), cache_dir=cache) == {}
