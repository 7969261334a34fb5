"""OpenAICompatProvider's streams: genuinely async callers (one event loop, like a consumer),
SSE lines split on every line ending, and a stream gzipped against our Accept-Encoding."""

from __future__ import annotations

import json
import threading

import pytest

from chat.llm.base import (
    StreamInterrupted,
)
from chat.llm.openai_compat import OpenAICompatProvider
from tests.llm.conftest import USER_HI, stream


async def test_async_stream_in_the_test_loop(provider, fake_llm):
    fake_llm.script("alpha beta", "gamma")
    texts = []
    for _ in range(2):
        events = [e async for e in provider.astream_chat(messages=USER_HI)]
        texts.append(events[-1].text)
    assert texts == ["alpha beta", "gamma"]
    await provider.aclose()


async def test_async_interruption_keeps_partial(provider, fake_llm):
    fake_llm.fail_next("cut", after_tokens=1)
    got = []
    with pytest.raises(StreamInterrupted) as info:
        async for event in provider.astream_chat(messages=USER_HI):
            got.append(event.text)
    assert info.value.partial == "Echo: " == "".join(got)


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        ([b"data: a\n\n"], ["data: a", ""]),
        ([b"data: a\r\n\r\n"], ["data: a", ""]),
        ([b"data: a\r", b"\ndata: b\r", b"\r"], ["data: a", "data: b", ""]),
        ([b"da", b"ta: a", b"\n"], ["data: a"]),
        # A multi-byte character split across chunks decodes whole.
        (["data: é\n".encode()[:7], "data: é\n".encode()[7:]], ["data: é"]),
        ([b"data: a\n", b"data: tail"], ["data: a", "data: tail"]),
    ],
)
def test_sse_lines_split_on_every_line_ending(chunks, lines):
    from chat.llm.openai_compat import _SSELines

    splitter = _SSELines()
    got = [line for chunk in chunks for line in splitter.feed(chunk)] + splitter.close()
    assert got == lines


def test_a_stream_compressed_against_our_accept_encoding_is_still_read(mode):
    """Streams ask for `identity` and read raw bytes; a server (or proxy) that gzips anyway
    is decoded, not parsed as garbage."""
    import gzip
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    chunks = [
        {"choices": [{"index": 0, "delta": {"content": word}}]} for word in ("al", "pha ", "beta")
    ]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    asked: list[str | None] = []

    class Gzipping(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            asked.append(self.headers.get("Accept-Encoding"))
            payload = gzip.compress(body.encode())
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gzipping)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        provider = OpenAICompatProvider(
            base_url=f"http://127.0.0.1:{server.server_port}/v1", model="m", max_retries=0
        )
        events = stream(provider, mode, messages=USER_HI)
    finally:
        server.shutdown()
        server.server_close()
    assert "".join(e.text for e in events if e.kind == "delta") == "alpha beta"
    assert events[-1].kind == "done"
    assert asked[0] == "identity"
