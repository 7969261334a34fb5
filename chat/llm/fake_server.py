"""A fake OpenAI-compatible server: a real HTTP server on loopback for tests, benchmarks and
offline demos (`python manage.py fakellm`).

Endpoints: `POST /v1/chat/completions` (stream and non-stream, tool calls in the OpenAI delta
format), `GET /v1/models`, and a control API under `/_control/` mirroring the Python API, so a
test can drive a server living in another process.

Which calls are summaries: a request whose first system message contains `SUMMARY_MARKER`
("CADAU_SUMMARY_REQUEST") is a summary call. Summary calls take replies from the summary
script queue and, when it is empty, get a deterministic extractive digest of their input, no
longer than max_tokens x 4 runes nor than the prompt's "at most N characters".
Chat calls take from the chat queue, else get "Echo: <last user message>".

Faults are consumed before scripts: a call failed outright leaves the script for the retry;
a fault that strikes mid-stream (cut, hang after K tokens) plays the script up to that point.

Every stream chunk carries `created` and `x_emit_ts` (the server's time.time() when the chunk
was written), so a client can measure the latency it adds on top of the model's.
"""

from __future__ import annotations

import heapq
import itertools
import json
import re
import socketserver
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from chat.llm.base import (
    SUMMARY_MARKER,
    Message,
    is_summary_request,
    message_text,
    requested_max_runes,
)
from chat.llm.offline import RUNES_PER_TOKEN, extractive_summary

__all__ = [
    "FAULT_KINDS",
    "SUMMARY_MARKER",
    "Call",
    "FakeLLMServer",
    "Fault",
    "ScriptedReply",
]

Target = Literal["chat", "summary", "any"]

#: http_error (status, retry_after, message) · hang (seconds, after_tokens: None = before the
#: response, K = mid-stream after K tokens) · cut (close the connection after `after_tokens`
#: tokens) · context_length (400, code context_length_exceeded) · invalid_json (200 with a body
#: / stream that is not JSON) · empty (200, empty content) · garbage (200, content "ERROR: ...").
#: Shorthands "500", "503", "429" mean http_error with that status.
FAULT_KINDS = frozenset(
    {"http_error", "hang", "cut", "context_length", "invalid_json", "empty", "garbage"}
)

GARBAGE_TEXT = "ERROR: upstream model failure (injected by the fake LLM server)"
CONTEXT_LENGTH_BODY = {
    "error": {
        "message": (
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9000 tokens. Please reduce the length of the messages."
        ),
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
# Default summary digest cap when the caller gives no max_tokens: "short".
DEFAULT_SUMMARY_RUNES = 1500

_CJK = r"\u2e80-\u9fff\uac00-\ud7af\uff00-\uffef"
_TOKEN = re.compile(rf"[{_CJK}]|[^\s{_CJK}]+\s*|\s+")


def tokenize(text: str) -> list[str]:
    """Words with their trailing space, CJK one character each: pieces join back to `text`."""
    return _TOKEN.findall(text)


@dataclass(slots=True)
class ScriptedReply:
    content: str = ""
    #: [{"name": str, "arguments": str | dict, "id"?: str}]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None  # default: "tool_calls" if tool_calls else "stop"
    token_ms: float | None = None  # override the server's rate for this reply

    @classmethod
    def coerce(cls, value: str | dict[str, Any] | ScriptedReply) -> ScriptedReply:
        if isinstance(value, ScriptedReply):
            return value
        if isinstance(value, str):
            return cls(content=value)
        if isinstance(value, dict):
            known = {"content", "tool_calls", "finish_reason", "token_ms"}
            unknown = set(value) - known
            if unknown:
                raise ValueError(f"unknown reply fields: {sorted(unknown)}")
            return cls(
                content=str(value.get("content") or ""),
                tool_calls=list(value.get("tool_calls") or []),
                finish_reason=value.get("finish_reason"),
                token_ms=value.get("token_ms"),
            )
        raise TypeError(f"cannot script a reply from {type(value).__name__}")


@dataclass(slots=True)
class Fault:
    kind: str
    target: Target = "any"
    times: int = 1
    on_call: int | None = None  # 1-based index among all calls; None = the next matching calls
    status: int = 500
    retry_after: float | None = None
    after_tokens: int | None = None
    seconds: float = 30.0
    message: str = ""

    def __post_init__(self) -> None:
        if self.kind in {"500", "502", "503", "429"}:
            self.status = int(self.kind)
            self.kind = "http_error"
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {sorted(FAULT_KINDS)}")
        if self.target not in ("chat", "summary", "any"):
            raise ValueError(f"unknown target {self.target!r}")
        if self.kind == "cut" and self.after_tokens is None:
            self.after_tokens = 3

    def matches(self, *, kind: str) -> bool:
        return self.target in ("any", kind)


@dataclass(slots=True)
class Call:
    index: int  # 1-based, across all kinds
    kind: Literal["chat", "summary"]
    body: dict[str, Any]
    headers: dict[str, str]
    stream: bool
    fault: str | None
    received_at: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # The default backlog of 5 drops SYNs when 200 clients connect at once (1 s retransmits).
    request_queue_size = 1024
    allow_reuse_address = True
    fake: FakeLLMServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out or hang up mid-reply are part of the job, not server errors.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError | _ClientGone):
            return
        super().handle_error(request, client_address)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls getfqdn(), a reverse DNS lookup that can hang offline.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


@dataclass(eq=False)
class _PacedStream:
    emit: Any  # piece -> None; raises _ClientGone
    pieces: list[Any]
    interval: float
    done: threading.Event = field(default_factory=threading.Event)
    sent: int = 0
    error: BaseException | None = None


class _Pacer:
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


class FakeLLMServer:
    """See the module docstring. Thread-safe; use as a context manager or start()/stop()."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, token_ms: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.fake = self
        self._thread: threading.Thread | None = None
        self._default_token_ms = token_ms
        self.pacer = _Pacer()
        self._init_state()

    def _init_state(self) -> None:
        self._scripts: dict[str, deque[ScriptedReply]] = {"chat": deque(), "summary": deque()}
        self._faults: list[Fault] = []
        self._calls: list[Call] = []
        self.token_ms: float = self._default_token_ms
        self.reply_words: int | None = None
        self.reject_stream_options = False
        self.require_api_key: str | None = None
        # Hanging handlers wait on this; reset()/stop() set it so no thread outlives a test.
        self._release = threading.Event()

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What LLM_BASE_URL should be set to."""
        return f"{self.url}/v1"

    def start(self) -> FakeLLMServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, name="fake-llm", daemon=True
            )
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Run in the calling thread (the management command)."""
        self._httpd.serve_forever()

    def stop(self) -> None:
        with self._lock:
            self._release.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- control -------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget scripts, faults, calls and configuration; wake any hanging handler."""
        with self._lock:
            self._release.set()
            self._init_state()

    def script(
        self,
        *replies: str | dict[str, Any] | ScriptedReply,
        target: Literal["chat", "summary"] = "chat",
    ) -> None:
        """Queue replies for the next calls of `target` kind, in order."""
        if target not in ("chat", "summary"):
            raise ValueError("target must be 'chat' or 'summary'")
        coerced = [ScriptedReply.coerce(r) for r in replies]
        with self._lock:
            self._scripts[target].extend(coerced)

    def script_summary(self, *replies: str | dict[str, Any] | ScriptedReply) -> None:
        self.script(*replies, target="summary")

    def fail_next(
        self,
        kind: str,
        *,
        times: int = 1,
        target: Target = "any",
        on_call: int | None = None,
        status: int = 500,
        retry_after: float | None = None,
        after_tokens: int | None = None,
        seconds: float = 30.0,
        message: str = "",
    ) -> Fault:
        """Inject `kind` (see FAULT_KINDS) into the next `times` matching calls, or into call
        number `on_call` (1-based, counted across all kinds) when given."""
        fault = Fault(
            kind=kind,
            target=target,
            times=times,
            on_call=on_call,
            status=status,
            retry_after=retry_after,
            after_tokens=after_tokens,
            seconds=seconds,
            message=message,
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def configure(
        self,
        *,
        token_ms: float | None = None,
        reply_words: int | None = None,
        reject_stream_options: bool | None = None,
        require_api_key: str | None = None,
    ) -> None:
        """token_ms: delay between streamed tokens. reply_words: pad default chat replies to
        this many words (benchmarks want fixed-size replies). reject_stream_options: answer
        400 to requests carrying stream_options, like some older servers. require_api_key:
        401 unless `Authorization: Bearer <key>`. None leaves a setting unchanged."""
        with self._lock:
            if token_ms is not None:
                self.token_ms = float(token_ms)
            if reply_words is not None:
                self.reply_words = int(reply_words) or None
            if reject_stream_options is not None:
                self.reject_stream_options = bool(reject_stream_options)
            if require_api_key is not None:
                self.require_api_key = require_api_key or None

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def count(self, kind: Literal["chat", "summary"] | None = None) -> int:
        with self._lock:
            return sum(1 for c in self._calls if kind is None or c.kind == kind)

    @property
    def call_count(self) -> int:
        return self.count()

    def calls_json(self) -> dict[str, Any]:
        with self._lock:
            calls = [c.as_json() for c in self._calls]
        return {
            "total": len(calls),
            "chat": sum(1 for c in calls if c["kind"] == "chat"),
            "summary": sum(1 for c in calls if c["kind"] == "summary"),
            "calls": calls,
        }

    # --- per-request decisions (called from handler threads) -----------------------------

    def _admit(
        self, *, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[Call, Fault | None, ScriptedReply | None, threading.Event, dict[str, Any]]:
        """Record the call and decide, atomically, which fault or script it gets."""
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        kind: Literal["chat", "summary"] = (
            "summary" if is_summary_request(messages or []) else "chat"
        )
        with self._lock:
            index = len(self._calls) + 1
            fault = self._take_fault(kind=kind, index=index)
            reply = None
            # A fault that strikes mid-stream (cut, or hang after K tokens) plays the scripted
            # reply up to that point; one that fails the whole call leaves it for the retry.
            mid_stream = fault is not None and (
                fault.kind == "cut" or (fault.kind == "hang" and fault.after_tokens is not None)
            )
            if (fault is None or mid_stream) and self._scripts[kind]:
                reply = self._scripts[kind].popleft()
            call = Call(
                index=index,
                kind=kind,
                body=body,
                headers=headers,
                stream=bool(body.get("stream")),
                fault=fault.kind if fault else None,
                received_at=time.time(),
            )
            self._calls.append(call)
            config = {
                "token_ms": self.token_ms,
                "reply_words": self.reply_words,
                "reject_stream_options": self.reject_stream_options,
                "require_api_key": self.require_api_key,
            }
            return call, fault, reply, self._release, config

    def _take_fault(self, *, kind: str, index: int) -> Fault | None:
        pinned = [f for f in self._faults if f.on_call == index and f.matches(kind=kind)]
        queued = [f for f in self._faults if f.on_call is None and f.matches(kind=kind)]
        for fault in pinned or queued[:1]:
            fault.times -= 1
            if fault.times <= 0 or fault.on_call is not None:
                self._faults.remove(fault)
            return fault
        return None


def _default_reply(
    *, kind: str, messages: list[Message], max_tokens: int | None, reply_words: int | None
) -> ScriptedReply:
    if kind == "summary":
        cap = max_tokens * RUNES_PER_TOKEN if max_tokens else DEFAULT_SUMMARY_RUNES
        asked = requested_max_runes(messages)
        cap = min(cap, asked) if asked else cap
        return ScriptedReply(content=extractive_summary(messages, max_runes=cap))
    last_user = ""
    for message in reversed(messages):
        if message.get("role") == "user":
            last_user = " ".join(message_text(message).split())
            break
    text = f"Echo: {last_user}"
    if reply_words:
        words = text.split()
        filler = (f"w{i}" for i in range(reply_words))
        text = " ".join((words + list(filler))[:reply_words])
    return ScriptedReply(content=text)


def _prompt_tokens(messages: list[Message]) -> int:
    return max(1, sum(len(message_text(m)) for m in messages) // RUNES_PER_TOKEN)


def _tool_calls_openai(reply: ScriptedReply, *, call_index: int) -> list[dict[str, Any]]:
    out = []
    for i, call in enumerate(reply.tool_calls):
        args = call.get("arguments", "")
        out.append(
            {
                "id": str(call.get("id") or f"call_{call_index}_{i}"),
                "type": "function",
                "function": {
                    "name": str(call["name"]),
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    return out


class _ClientGone(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    # Tokens are tiny writes; Nagle + delayed ACK would add ~40 ms to each.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests and benchmarks do not want a line per request

    @property
    def fake(self) -> FakeLLMServer:
        return self.server.fake

    # --- plumbing ------------------------------------------------------------------------

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        return json.loads(raw)

    def _send_json(
        self, status: int, payload: Any, *, extra_headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self._send_raw(status, data, content_type="application/json", extra_headers=extra_headers)

    def _send_raw(
        self,
        status: int,
        data: bytes,
        *,
        content_type: str,
        extra_headers: dict[str, str] | None = None,
        declared_length: int | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(declared_length or len(data)))
        for key, value in (extra_headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError as exc:  # BrokenPipe/ConnectionReset: the client gave up (timeout)
            raise _ClientGone from exc

    def _error(self, status: int, message: str, *, code: str | None = None, **headers: str) -> None:
        body = {"error": {"message": message, "type": "fake_error", "code": code}}
        self._send_json(status, body, extra_headers=headers or None)

    def _chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise _ClientGone from exc

    def _event(self, payload: dict[str, Any] | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        self._chunk(f"data: {text}\n\n".encode())

    # --- routing -------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            now = int(time.time())
            models = [
                {"id": name, "object": "model", "created": now, "owned_by": "cadau-fake"}
                for name in ("fake-chat", "fake-summary")
            ]
            self._send_json(200, {"object": "list", "data": models})
        elif path == "/_control/calls":
            self._send_json(200, self.fake.calls_json())
        elif path in ("/_control/health", ""):
            self._send_json(200, {"ok": True})
        else:
            self._error(404, f"no route for GET {path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            body = self._read_json()
        except ValueError:
            self._error(400, "request body is not valid JSON", code="invalid_json")
            return
        if not isinstance(body, dict):
            self._error(400, "request body must be a JSON object")
            return
        if path in ("/v1/chat/completions", "/chat/completions"):
            self._completions(body)
        elif path.startswith("/_control/"):
            self._control(path.removeprefix("/_control/"), body)
        else:
            self._error(404, f"no route for POST {path}")

    def _control(self, action: str, body: dict[str, Any]) -> None:
        fake = self.fake
        try:
            if action == "script":
                replies = body.get("replies")
                if replies is None:
                    replies = [body["reply"]]
                fake.script(*replies, target=body.get("target", "chat"))
            elif action == "fault":
                fake.fail_next(**body)
            elif action == "config":
                fake.configure(**body)
            elif action == "reset":
                fake.reset()
            else:
                self._error(404, f"unknown control action {action!r}")
                return
        except (KeyError, TypeError, ValueError) as exc:
            self._error(400, f"bad control request: {exc}")
            return
        self._send_json(200, {"ok": True})

    # --- the model -----------------------------------------------------------------------

    def _completions(self, body: dict[str, Any]) -> None:
        try:
            self._answer(body)
        except _ClientGone:
            self.close_connection = True

    def _answer(self, body: dict[str, Any]) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        call, fault, reply, release, config = self.fake._admit(body=body, headers=headers)
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        if not isinstance(messages, list) or not messages:
            self._error(400, "messages must be a non-empty list", code="invalid_request")
            return
        key = config["require_api_key"]
        if key and headers.get("authorization") != f"Bearer {key}":
            self._error(401, "Incorrect API key provided", code="invalid_api_key")
            return
        if config["reject_stream_options"] and "stream_options" in body:
            self._error(400, "Unrecognized request argument supplied: stream_options")
            return

        if fault is not None:
            if fault.kind == "hang" and fault.after_tokens is None:
                release.wait(fault.seconds)
            elif fault.kind == "http_error":
                extra = {}
                if fault.retry_after is not None:
                    extra["Retry-After"] = f"{fault.retry_after:g}"
                message = fault.message or f"injected HTTP {fault.status}"
                self._error(fault.status, message, code=str(fault.status), **extra)
                return
            elif fault.kind == "context_length":
                self._send_json(400, CONTEXT_LENGTH_BODY)
                return
            elif fault.kind == "empty":
                reply = ScriptedReply(content="")
            elif fault.kind == "garbage":
                reply = ScriptedReply(content=fault.message or GARBAGE_TEXT)

        max_tokens = body.get("max_tokens") if isinstance(body.get("max_tokens"), int) else None
        if reply is None:
            reply = _default_reply(
                kind=call.kind,
                messages=messages,
                max_tokens=max_tokens,
                reply_words=config["reply_words"],
            )
        token_ms = reply.token_ms if reply.token_ms is not None else config["token_ms"]
        model = str(
            body.get("model") or ("fake-summary" if call.kind == "summary" else "fake-chat")
        )
        if body.get("stream"):
            self._stream(
                call=call,
                reply=reply,
                fault=fault,
                release=release,
                model=model,
                messages=messages,
                token_ms=token_ms,
                body=body,
            )
        else:
            self._whole(call=call, reply=reply, fault=fault, model=model, messages=messages)

    def _whole(
        self,
        *,
        call: Call,
        reply: ScriptedReply,
        fault: Fault | None,
        model: str,
        messages: list[Message],
    ) -> None:
        if fault is not None and fault.kind == "invalid_json":
            self._send_raw(200, b'{"choices": [ {"message": nope', content_type="application/json")
            return
        tool_calls = _tool_calls_openai(reply, call_index=call.index)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        completion_tokens = len(tokenize(reply.content)) + len(tool_calls)
        prompt_tokens = _prompt_tokens(messages)
        payload = {
            "id": f"chatcmpl-fake-{call.index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": reply.finish_reason
                    or ("tool_calls" if tool_calls else "stop"),
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        data = json.dumps(payload, ensure_ascii=False).encode()
        if fault is not None and fault.kind == "cut":
            # Promise the whole body, deliver half, hang up: the client sees a short read.
            self._send_raw(
                200,
                data[: len(data) // 2],
                content_type="application/json",
                declared_length=len(data),
            )
            self.close_connection = True
            return
        self._send_raw(200, data, content_type="application/json")

    def _stream(
        self,
        *,
        call: Call,
        reply: ScriptedReply,
        fault: Fault | None,
        release: threading.Event,
        model: str,
        messages: list[Message],
        token_ms: float,
        body: dict[str, Any],
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        chunk_id = f"chatcmpl-fake-{call.index}"

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            now = time.time()
            return {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": int(now),
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                "x_emit_ts": now,
            }

        if fault is not None and fault.kind == "invalid_json":
            self._chunk(b'data: {"choices": [{"delta": {"content": nope\n\n')
            self._chunk(b"")
            return

        # The pieces of the reply, each written as one chunk at the token rate.
        pieces: list[dict[str, Any]] = [{"content": t} for t in tokenize(reply.content)]
        tool_calls = _tool_calls_openai(reply, call_index=call.index)
        for i, tc in enumerate(tool_calls):
            opening = {
                "index": i,
                "id": tc["id"],
                "type": "function",
                "function": {"name": tc["function"]["name"], "arguments": ""},
            }
            pieces.append({"tool_calls": [opening]})
            args = tc["function"]["arguments"]
            for start in range(0, len(args), 8):
                frag = args[start : start + 8]
                pieces.append({"tool_calls": [{"index": i, "function": {"arguments": frag}}]})

        stop_after = fault.after_tokens if fault and fault.kind in ("cut", "hang") else None
        self._event(chunk({"role": "assistant", "content": ""}))
        if stop_after is None and token_ms > 0 and len(pieces) > 1:
            self.fake.pacer.run(
                emit=lambda piece: self._event(chunk(piece)),
                pieces=pieces,
                interval=token_ms / 1000,
            )
            pieces_left: list[dict[str, Any]] = []
        else:
            pieces_left = pieces
        for n, piece in enumerate(pieces_left):
            if stop_after is not None and n == stop_after:
                assert fault is not None
                if fault.kind == "cut":
                    # No terminating chunk: the client sees the body end mid-stream.
                    self.close_connection = True
                    return
                release.wait(fault.seconds)
            if n and token_ms > 0:
                time.sleep(token_ms / 1000)
            self._event(chunk(piece))

        finish = reply.finish_reason or ("tool_calls" if tool_calls else "stop")
        self._event(chunk({}, finish_reason=finish))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            prompt_tokens = _prompt_tokens(messages)
            usage_chunk = chunk({})
            usage_chunk["choices"] = []
            usage_chunk["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(pieces),
                "total_tokens": prompt_tokens + len(pieces),
            }
            self._event(usage_chunk)
        self._event("[DONE]")
        self._chunk(b"")  # terminating zero-length chunk
