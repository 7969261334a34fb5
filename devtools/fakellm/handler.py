"""The HTTP side of the fake LLM server: routing, the control API, and the OpenAI wire format
of completions (whole and streamed)."""

from __future__ import annotations

import json
import socketserver
import sys
import threading
import time
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from devtools.fakellm.completion import Answer, send_stream, send_whole
from devtools.fakellm.embeddings import embeddings_answer
from devtools.fakellm.scripts import (
    DEFAULT_QUOTED_WINDOW,
    GARBAGE_TEXT,
    Call,
    Fault,
    ScriptedReply,
    ServerConfig,
    context_length_body,
    default_reply,
    llama_cpp_python_overflow_body,
    quoted_answer,
)

if TYPE_CHECKING:
    from devtools.fakellm.server import FakeLLMServer


class _ClientGone(Exception):
    pass


class HTTPServer(ThreadingHTTPServer):
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


@dataclass(slots=True)
class Admission:
    """What FakeLLMServer decided for one call, under its lock, when the call arrived."""

    call: Call
    fault: Fault | None
    #: The fault comes from the configured context window, not from fail_next.
    overflow: bool
    reply: ScriptedReply | None
    prompt_tokens: int
    config: ServerConfig
    release: threading.Event
    #: Held while answering when the server has a slot limit.
    slots: threading.Semaphore | None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HTTPServer
    # Tokens are tiny writes; Nagle + delayed ACK would add ~40 ms to each.
    disable_nagle_algorithm = True
    # The body of the request being handled, as received (what a Call keeps).
    raw_body = b""

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests and benchmarks do not want a line per request

    @property
    def fake(self) -> FakeLLMServer:
        return self.server.fake

    # --- plumbing ------------------------------------------------------------------------

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self.raw_body = raw
        if not raw:
            return {}
        return json.loads(raw)

    def send_json(
        self, status: int, payload: Any, *, extra_headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_raw(status, data, content_type="application/json", extra_headers=extra_headers)

    def send_raw(
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
        self.send_json(status, body, extra_headers=headers or None)

    def chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise _ClientGone from exc

    def event(self, payload: dict[str, Any] | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        self.chunk(f"data: {text}\n\n".encode())

    # --- routing -------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            config = self.fake.config
            now = int(time.time())
            models = [
                config.model_card(name, created=now) for name in ("fake-chat", "fake-summary")
            ]
            self.send_json(200, {"object": "list", "data": models})
        elif path == "/_control/calls":
            # ?since=N: only the calls after call number N; ?bodies=0: without request bodies.
            query = parse_qs(self.path.partition("?")[2])
            try:
                since = max(0, int(query.get("since", ["0"])[0]))
            except ValueError:
                self._error(400, "since must be an integer")
                return
            bodies = query.get("bodies", ["1"])[0] not in ("0", "false")
            self.send_json(200, self.fake.calls_json(since=since, bodies=bodies))
        elif path in ("/_control/health", ""):
            self.send_json(200, {"ok": True})
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
        elif path in ("/v1/embeddings", "/embeddings"):
            self._embeddings(body)
        elif path.startswith("/_control/"):
            self._control(path.removeprefix("/_control/"), body)
        else:
            self._error(404, f"no route for POST {path}")

    def _embeddings(self, body: dict[str, Any]) -> None:
        raw = body.get("input")
        texts = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
        status, delay, release = self.fake._embedding_admit([str(t) for t in texts])
        if delay:
            release.wait(delay)
        if status:
            self._error(status, "embedding refused (fake limit)" if status == 400 else "fault")
            return
        status, payload = embeddings_answer(body, per_token=self.fake.embedding_per_token)
        try:
            self.send_json(status, payload)
        except _ClientGone:
            self.close_connection = True

    def _control(self, action: str, body: dict[str, Any]) -> None:
        fake = self.fake
        try:
            if action == "script":
                replies = body.get("replies")
                if replies is None:
                    replies = [body["reply"]]
                fake.script(
                    *replies,
                    target=body.get("target", "chat"),
                    replace=bool(body.get("replace", False)),
                )
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
        self.send_json(200, {"ok": True})

    def start_event_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def end_chunks(self) -> None:
        self.chunk(b"")  # the terminating zero-length chunk

    # --- the model -----------------------------------------------------------------------

    def _completions(self, body: dict[str, Any]) -> None:
        try:
            self._answer(body)
        except _ClientGone:
            self.close_connection = True

    def _rejected(self, admission: Admission, body: dict[str, Any], model: str) -> bool:
        """Answer the errors a server gives before it looks at the prompt; True if it did."""
        config = admission.config
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            self._error(400, "messages must be a non-empty list", code="invalid_request")
        elif config.require_api_key and (
            self.headers.get("Authorization") != f"Bearer {config.require_api_key}"
        ):
            self._error(401, "Incorrect API key provided", code="invalid_api_key")
        elif config.reject_stream_options and "stream_options" in body:
            self._error(400, "Unrecognized request argument supplied: stream_options")
        elif config.reject_tools and body.get("tools"):
            # Ollama's wording for a model without tool support.
            self._error(400, f"{model} does not support tools")
        else:
            return False
        return True

    def _answer(self, body: dict[str, Any]) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        admission = self.fake._admit(body=body, raw_body=self.raw_body, headers=headers)
        call = admission.call
        model = str(
            body.get("model") or ("fake-summary" if call.kind == "summary" else "fake-chat")
        )
        if self._rejected(admission, body, model):
            return
        if admission.slots is None:
            self._respond(admission, body, model)
            return
        with self.fake.slot(admission.slots):
            self._respond(admission, body, model)

    def _respond(self, admission: Admission, body: dict[str, Any], model: str) -> None:
        call, fault, config = admission.call, admission.fault, admission.config
        call.started_at = time.time()
        reply = admission.reply
        stream = bool(body.get("stream"))
        if fault is not None:
            if fault.kind == "hang" and fault.after_tokens is None:
                admission.release.wait(fault.seconds)
            elif fault.kind == "http_error":
                extra = {}
                if fault.retry_after is not None:
                    extra["Retry-After"] = f"{fault.retry_after:g}"
                message = fault.message or f"injected HTTP {fault.status}"
                self._error(fault.status, message, code=str(fault.status), **extra)
                return
            elif fault.kind == "context_length":
                window = config.context_window
                self.send_json(
                    400, context_length_body(window=window, prompt_tokens=admission.prompt_tokens)
                )
                return
            elif fault.kind == "overflow_cut" and not stream:
                overflow = llama_cpp_python_overflow_body(
                    window=config.context_window or DEFAULT_QUOTED_WINDOW,
                    prompt_tokens=admission.prompt_tokens,
                    max_tokens=_max_tokens(body),
                )
                self.send_json(400, overflow)
                return
            elif fault.kind == "empty":
                reply = ScriptedReply(content="")
            elif fault.kind == "garbage":
                reply = ScriptedReply(content=fault.message or GARBAGE_TEXT)

        max_tokens = _max_tokens(body)
        if reply is None and call.kind == "summary" and config.summary_style == "fail":
            self._error(500, "summary model unavailable (summary_style=fail)", code="500")
            return
        if reply is None:
            reply = default_reply(
                kind=call.kind,
                messages=body["messages"],
                max_tokens=max_tokens,
                reply_words=config.reply_words,
                summary_style=config.summary_style,
            )
        if reply.quote:
            reply = replace(
                reply, content=quoted_answer(messages=body["messages"], quote=reply.quote)
            )
        if fault is not None:
            reply = fault.shape(reply, max_tokens=max_tokens)
        answer = Answer(
            call=call,
            reply=reply,
            fault=fault,
            overflow=admission.overflow,
            model=model,
            prompt_tokens=admission.prompt_tokens,
            token_ms=reply.token_ms if reply.token_ms is not None else config.token_ms,
            usage=config.usage and not (fault is not None and fault.kind == "no_usage"),
            release=admission.release,
            someone_waiting=(
                self.fake.someone_waiting
                if config.interrupt_requests and admission.slots is not None
                else None
            ),
        )
        if not stream:
            send_whole(self, answer)
            return
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        send_stream(self, answer, pacer=self.fake.pacer, include_usage=include_usage)


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
