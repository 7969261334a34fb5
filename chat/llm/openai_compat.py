"""Client for any OpenAI-compatible chat-completions endpoint (OpenAI, DeepSeek, Qwen, vLLM,
Ollama, llama.cpp server).

The wire format lives in `_Codec` and `_StreamState`, which do no I/O, so the sync flavour
(httpx.Client, used by summaries in worker threads) and the async flavour (httpx.AsyncClient,
used by streaming replies in consumers) differ only in how they wait. Retry decisions live in
`_RetryPolicy` for the same reason.

Retries: connect errors, timeouts and 408/429/5xx are retried with exponential backoff and
jitter, but only while nothing has reached the caller. Once a delta has been yielded a retry
would make the model say things twice, so a broken stream raises StreamInterrupted with the
partial text instead.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from chat.llm.base import (
    Completion,
    ContextLengthExceeded,
    LLMError,
    Message,
    StreamEvent,
    StreamInterrupted,
    ToolCall,
    Usage,
    is_summary_request,
)
from chat.llm.transport import AiohttpTransport, loop_is_long_lived

logger = logging.getLogger("chat.llm")

# Lower-case fragments that identify "prompt larger than the context window" across providers:
# OpenAI/DeepSeek ("This model's maximum context length is ..."), vLLM (same wording),
# llama.cpp ("exceeds the available context size", type exceed_context_size_error), Ollama,
# Qwen/DashScope ("Range of input length should be ..."), Anthropic-style "prompt is too long".
_CONTEXT_MARKERS = (
    "context_length_exceeded",
    "exceed_context_size",
    "maximum context length",
    "context length",
    "context window",
    "context size",
    "too many tokens",
    "prompt is too long",
    "prompt too long",
    "input is too long",
    "input length",
    "reduce the length of the messages",
)

_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})

# How much of an unreadable error body we quote back; enough to diagnose, not a log flood.
_ERROR_SNIPPET = 300


def _snippet(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = " ".join(text.split())
    return text[:_ERROR_SNIPPET] + ("…" if len(text) > _ERROR_SNIPPET else "")


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    try:
        # Fractions are non-standard but harmless to accept (test servers use them).
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    return Usage(
        prompt_tokens=_int_or_none(raw.get("prompt_tokens")),
        completion_tokens=_int_or_none(raw.get("completion_tokens")),
        total_tokens=_int_or_none(raw.get("total_tokens")),
    )


def _arguments_text(value: Any) -> str:
    # A few servers send arguments as an object rather than the JSON text OpenAI specifies.
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def error_from_payload(payload: Any) -> tuple[str, str]:
    """(message, searchable text) from the many error shapes providers use."""
    message = ""
    extra: list[str] = []
    if isinstance(payload, dict):
        err = payload.get("error", payload)
        if isinstance(err, dict):
            message = str(err.get("message") or err.get("detail") or "")
            extra = [str(err.get(k) or "") for k in ("code", "type", "param")]
        elif isinstance(err, str):
            message = err
        if not message:
            message = str(payload.get("message") or payload.get("detail") or "")
    if not message:
        message = _snippet(json.dumps(payload) if not isinstance(payload, str) else payload)
    return message, " ".join([message, *extra]).lower()


def classify_error(
    *, status: int | None, payload: Any, retry_after: float | None = None
) -> LLMError:
    """Turn a provider error (HTTP body or in-stream `error` object) into our exception."""
    message, haystack = error_from_payload(payload)
    label = (
        f"LLM provider error {status}: {message}" if status else f"LLM provider error: {message}"
    )
    # A 429 saying "too many tokens per minute" is a rate limit, not an oversized prompt.
    if status != 429 and (status == 413 or any(m in haystack for m in _CONTEXT_MARKERS)):
        return ContextLengthExceeded(label, status=status, retryable=False)
    retryable = status is not None and (status in _RETRYABLE_STATUS or status >= 500)
    return LLMError(label, status=status, retryable=retryable, retry_after=retry_after)


def transport_error(exc: httpx.HTTPError) -> LLMError:
    """Network-level failures. Everything but protocol misuse is worth another attempt."""
    if isinstance(exc, httpx.TimeoutException):
        return LLMError(f"LLM request timed out ({type(exc).__name__})", retryable=True)
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError | httpx.ProxyError):
        return LLMError(f"LLM request failed: {exc}", retryable=False)
    return LLMError(f"LLM connection failed ({type(exc).__name__}): {exc}", retryable=True)


class _SSELines:
    """Splits a byte stream into the lines of an event stream (`\n`, `\r\n` or `\r` ends a
    line), decoding each whole line as UTF-8.

    Why not httpx's `aiter_lines`: it stacks two more async generators (text, then lines) on
    the byte stream and its incremental decoders, per chunk, and a chunk is one token; with 200
    streams that was ~10% of the server's event loop (bench/realtime.py). A whole line can be
    decoded on its own: a UTF-8 sequence never contains a line break byte."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> list[str]:
        data = self._tail + chunk if self._tail else chunk
        if b"\r" in data:
            # A \r at the very end may be the first half of \r\n: decide with the next chunk.
            held = data.endswith(b"\r")
            if held:
                data = data[:-1]
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                data += b"\r"
        lines = data.split(b"\n")
        self._tail = lines.pop()
        return [line.decode("utf-8", "replace") for line in lines]

    def close(self) -> list[str]:
        """The last line, when the stream did not end with a line break (or ended with a \r
        held back for a \n that never came)."""
        tail, self._tail = self._tail, b""
        return [tail.removesuffix(b"\r").decode("utf-8", "replace")] if tail else []


@dataclass(slots=True)
class _PartialToolCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _StreamState:
    """Assembles one SSE stream: text, tool-call fragments, finish reason, usage."""

    def __init__(self) -> None:
        self.text_parts: list[str] = []
        self.tool_calls: dict[int, _PartialToolCall] = {}
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.done = False  # saw `data: [DONE]`
        #: True once a delta went to the caller: from then on a retry would duplicate text.
        self.emitted = False
        self._pending: list[str] = []
        #: `x_emit_ts` of the last chunk, when the server sends one (the fake server does).
        self.emitted_at: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def feed_line(self, line: str) -> str:
        """Consume one line of the event stream; return the new text it carried (maybe "")."""
        line = line.rstrip("\r")
        if not line:
            return self._flush_pending()
        if line.startswith(":") or not line.startswith("data:"):
            return ""  # comments, keep-alives, `event:`/`id:`/`retry:` fields
        data = line[5:].removeprefix(" ")
        if self._pending:
            self._pending.append(data)
            return ""
        # Most servers put one JSON object per data line; parse it right away so a server that
        # forgets the blank separator line still works. Multi-line data waits for the blank.
        if data.strip() == "[DONE]":
            self.done = True
            return ""
        try:
            # orjson: one parse per streamed token, ~3x cheaper than the stdlib's.
            chunk = orjson.loads(data)
        except ValueError:
            self._pending.append(data)
            return ""
        return self._apply(chunk)

    def deltas(self, lines: list[str]) -> Iterator[StreamEvent]:
        """`feed_line` for each line, up to `[DONE]`: the delta events they carry, each one
        out before the next line is parsed (a bad line fails after the good ones went out)."""
        for line in lines:
            text = self.feed_line(line)
            if text:
                self.emitted = True
                yield StreamEvent(kind="delta", text=text, emitted_at=self.emitted_at)
            if self.done:
                return

    def end_of_input(self) -> None:
        self._flush_pending()

    def _flush_pending(self) -> str:
        if not self._pending:
            return ""
        data = "\n".join(self._pending)
        self._pending = []
        if data.strip() == "[DONE]":
            self.done = True
            return ""
        try:
            chunk = orjson.loads(data)
        except ValueError as exc:
            raise LLMError(f"LLM stream carried invalid JSON: {_snippet(data)}") from exc
        return self._apply(chunk)

    def _apply(self, chunk: Any) -> str:
        if not isinstance(chunk, dict):
            raise LLMError(f"LLM stream carried an unexpected value: {_snippet(str(chunk))}")
        emitted_at = chunk.get("x_emit_ts")
        self.emitted_at = float(emitted_at) if isinstance(emitted_at, int | float) else None
        if chunk.get("error"):
            raise classify_error(status=None, payload=chunk)
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise LLMError("LLM stream chunk has malformed choices")
        new_text: list[str] = []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n>1 is never requested; ignore stray alternatives
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                new_text.append(content)
            for position, fragment in enumerate(delta.get("tool_calls") or []):
                self._apply_tool_fragment(position, fragment)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        text = "".join(new_text)
        if text:
            self.text_parts.append(text)
        return text

    def _apply_tool_fragment(self, position: int, fragment: Any) -> None:
        if not isinstance(fragment, dict):
            return
        index = fragment.get("index")
        call_id = fragment.get("id") or ""
        if not isinstance(index, int):
            # Servers that omit `index` send whole calls: match by id, else a new slot.
            by_id = [k for k, v in self.tool_calls.items() if call_id and v.id == call_id]
            index = by_id[0] if by_id else len(self.tool_calls) + position
        call = self.tool_calls.setdefault(index, _PartialToolCall())
        if call_id and not call.id:
            call.id = call_id
        function = fragment.get("function") or {}
        name = function.get("name")
        # OpenAI sends the name once; some servers repeat it in every fragment.
        if name and not call.name:
            call.name = str(name)
        args = function.get("arguments")
        if args is not None:
            call.arguments.append(_arguments_text(args))

    def assembled_tool_calls(self) -> list[ToolCall]:
        return [
            ToolCall(
                id=call.id or f"call_{index}",
                name=call.name,
                arguments="".join(call.arguments),
            )
            for index, call in sorted(self.tool_calls.items())
        ]

    def final_event(self) -> StreamEvent:
        return StreamEvent(
            kind="done",
            text=self.text,
            tool_calls=self.assembled_tool_calls(),
            finish_reason=self.finish_reason,
            usage=self.usage,
        )

    @property
    def complete(self) -> bool:
        # [DONE] is the contract, but some servers just close after the finish_reason chunk.
        return self.done or self.finish_reason is not None


class _Codec:
    """Request bodies and response parsing shared by the sync and async clients."""

    def __init__(self, *, model: str, summary_model: str) -> None:
        self.model = model
        self.summary_model = summary_model

    def pick_model(self, *, messages: list[Message], model: str | None) -> str:
        if model:
            return model
        # Summarising callers mark their prompt; they get the summary model without having to
        # know which one is configured.
        if is_summary_request(messages):
            return self.summary_model or self.model
        return self.model

    def body(
        self,
        *,
        messages: list[Message],
        model: str | None,
        stream: bool,
        include_usage: bool = False,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        temperature: float | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": messages}
        chosen = self.pick_model(messages=messages, model=model)
        if chosen:
            # llama.cpp and single-model vLLM accept no model at all; sending "" is rejected.
            body["model"] = chosen
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if temperature is not None:
            body["temperature"] = temperature
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
            if include_usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def error_from_response(self, *, status: int, raw: bytes, headers: httpx.Headers) -> LLMError:
        try:
            payload: Any = json.loads(raw)
        except ValueError:
            payload = raw.decode("utf-8", "replace")
        return classify_error(
            status=status,
            payload=payload,
            retry_after=_parse_retry_after(headers.get("retry-after")),
        )

    @staticmethod
    def rejects_stream_options(err: LLMError) -> bool:
        return err.status in (400, 422) and "stream_options" in str(err)

    def completion(self, *, raw: bytes, requested_model: str) -> Completion:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise LLMError(f"LLM returned invalid JSON: {_snippet(raw)}") from exc
        if not isinstance(data, dict):
            raise LLMError(f"LLM returned an unexpected value: {_snippet(raw)}")
        if data.get("error"):
            raise classify_error(status=None, payload=data)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise LLMError(f"LLM response has no choices: {_snippet(raw)}")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise LLMError(f"LLM response has no message: {_snippet(raw)}")
        content = message.get("content")
        tool_calls = []
        for index, call in enumerate(message.get("tool_calls") or []):
            if not isinstance(call, dict):
                continue
            function = call.get("function") or {}
            tool_calls.append(
                ToolCall(
                    id=str(call.get("id") or f"call_{index}"),
                    name=str(function.get("name") or ""),
                    arguments=_arguments_text(function.get("arguments")),
                )
            )
        return Completion(
            text=content if isinstance(content, str) else "",
            tool_calls=tool_calls,
            finish_reason=choice.get("finish_reason"),
            usage=_usage(data.get("usage")),
            model=str(data.get("model") or requested_model),
        )

    @staticmethod
    def unfinished_stream() -> LLMError:
        return LLMError("LLM stream ended before the reply was complete", retryable=True)

    @staticmethod
    def is_json_response(response: httpx.Response) -> bool:
        # Some servers ignore `stream: true` and answer with one JSON completion.
        return response.headers.get("content-type", "").startswith("application/json")

    @staticmethod
    def events_from_completion(completion: Completion) -> list[StreamEvent]:
        events = [StreamEvent(kind="delta", text=completion.text)] if completion.text else []
        events.append(
            StreamEvent(
                kind="done",
                text=completion.text,
                tool_calls=completion.tool_calls,
                finish_reason=completion.finish_reason,
                usage=completion.usage,
            )
        )
        return events


class _RetryPolicy:
    def __init__(
        self,
        *,
        max_retries: int,
        backoff_base_seconds: float,
        backoff_max_seconds: float,
        max_retry_after_seconds: float,
    ) -> None:
        self.max_retries = max(0, max_retries)
        self.backoff_base_seconds = backoff_base_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.max_retry_after_seconds = max_retry_after_seconds

    def delay(self, *, attempt: int, err: LLMError) -> float | None:
        """Seconds to wait before attempt `attempt + 1`, or None to give up with `err`."""
        if not err.retryable or attempt >= self.max_retries:
            return None
        if err.retry_after is not None:
            # A provider asking for minutes is telling us it is down for now: fail fast and let
            # the caller's own fallback (cut payload, show error) take over.
            if err.retry_after > self.max_retry_after_seconds:
                return None
            return err.retry_after + random.uniform(0, self.backoff_base_seconds / 4)
        ceiling = min(self.backoff_max_seconds, self.backoff_base_seconds * (2**attempt))
        # "Equal jitter": never less than half the backoff, so a herd still spreads out.
        return ceiling / 2 + random.uniform(0, ceiling / 2)


def _log_retry(*, attempt: int, delay: float, err: LLMError, url: str) -> None:
    logger.warning(
        "llm_retry attempt=%d delay=%.2fs status=%s url=%s reason=%s",
        attempt + 1,
        delay,
        err.status,
        url,
        err,
    )


class OpenAICompatProvider:
    """LLMProvider for `POST {base_url}/chat/completions`."""

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str = "",
        summary_model: str = "",
        timeout_seconds: float = 60.0,
        connect_timeout_seconds: float = 10.0,
        max_retries: int = 2,
        backoff_base_seconds: float = 0.5,
        backoff_max_seconds: float = 8.0,
        max_retry_after_seconds: float = 30.0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.summary_model = summary_model or model
        self._url = f"{self.base_url}/chat/completions"
        self._codec = _Codec(model=self.model, summary_model=self.summary_model)
        self._retry = _RetryPolicy(
            max_retries=max_retries,
            backoff_base_seconds=backoff_base_seconds,
            backoff_max_seconds=backoff_max_seconds,
            max_retry_after_seconds=max_retry_after_seconds,
        )
        # Read timeout is per socket read: it bounds the wait for the first token and the gap
        # between tokens, not the length of a whole streamed reply.
        self._timeout = httpx.Timeout(
            timeout_seconds,
            connect=connect_timeout_seconds,
            pool=connect_timeout_seconds,
        )
        # Many replies stream at once (one connection each); the default pool of 100 would make
        # the 101st wait for a pool slot and time out.
        self._limits = httpx.Limits(max_connections=1000, max_keepalive_connections=50)
        self._headers = {"Accept": "application/json", "User-Agent": "cadau"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(timeout=self._timeout, limits=self._limits)
        # An AsyncClient is bound to the event loop that first used it; Django runs several
        # loops (per thread, per test), so each loop gets its own.
        self._async_clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, httpx.AsyncClient
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        # Flipped off for good the first time the server rejects `stream_options`.
        self._send_stream_options = True

    @property
    def is_offline(self) -> bool:
        return False

    @property
    def host(self) -> str:
        """Host and port of the endpoint, without credentials: safe to show in the UI."""
        parts = urlsplit(self.base_url)
        return parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else ""

    def __repr__(self) -> str:
        return f"OpenAICompatProvider(host={self.host!r}, model={self.model!r})"

    # --- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        self._client.close()

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._async_clients.pop(loop, None)
        if client is not None:
            await client.aclose()

    def _aclient(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._async_clients.get(loop)
            if client is None or client.is_closed:
                transport = (
                    AiohttpTransport(limits=self._limits) if loop_is_long_lived(loop) else None
                )
                client = httpx.AsyncClient(
                    timeout=self._timeout, limits=self._limits, transport=transport
                )
                self._async_clients[loop] = client
            return client

    def _stream_headers(self) -> dict[str, str]:
        # identity: a token is a few bytes; compressing each chunk saves nothing, and an
        # uncompressed body is read as is (astream_chat).
        return {**self._headers, "Accept": "text/event-stream", "Accept-Encoding": "identity"}

    # --- non-streaming -------------------------------------------------------------------

    def complete(
        self,
        *,
        messages: list[Message],
        model: str | None = None,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        temperature: float | None = None,
    ) -> Completion:
        body = self._codec.body(
            messages=messages,
            model=model,
            stream=False,
            max_tokens=max_tokens,
            tools=tools,
            temperature=temperature,
        )
        attempt = 0
        while True:
            try:
                response = self._client.post(self._url, json=body, headers=self._headers)
                if response.status_code != 200:
                    raise self._codec.error_from_response(
                        status=response.status_code, raw=response.content, headers=response.headers
                    )
                return self._codec.completion(
                    raw=response.content, requested_model=body.get("model", "")
                )
            except httpx.HTTPError as exc:
                err = transport_error(exc)
                cause: BaseException = exc
            except LLMError as exc:
                err = cause = exc
            delay = self._retry.delay(attempt=attempt, err=err)
            if delay is None:
                raise err from (cause if cause is not err else None)
            _log_retry(attempt=attempt, delay=delay, err=err, url=self._url)
            time.sleep(delay)
            attempt += 1

    async def acomplete(
        self,
        *,
        messages: list[Message],
        model: str | None = None,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        temperature: float | None = None,
    ) -> Completion:
        body = self._codec.body(
            messages=messages,
            model=model,
            stream=False,
            max_tokens=max_tokens,
            tools=tools,
            temperature=temperature,
        )
        client = self._aclient()
        attempt = 0
        while True:
            try:
                response = await client.post(self._url, json=body, headers=self._headers)
                if response.status_code != 200:
                    raise self._codec.error_from_response(
                        status=response.status_code, raw=response.content, headers=response.headers
                    )
                return self._codec.completion(
                    raw=response.content, requested_model=body.get("model", "")
                )
            except httpx.HTTPError as exc:
                err = transport_error(exc)
                cause: BaseException = exc
            except LLMError as exc:
                err = cause = exc
            delay = self._retry.delay(attempt=attempt, err=err)
            if delay is None:
                raise err from (cause if cause is not err else None)
            _log_retry(attempt=attempt, delay=delay, err=err, url=self._url)
            await asyncio.sleep(delay)
            attempt += 1

    # --- streaming -----------------------------------------------------------------------

    def _stream_body(
        self, *, messages: list[Message], model: str | None, tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        return self._codec.body(
            messages=messages,
            model=model,
            stream=True,
            include_usage=self._send_stream_options,
            tools=tools,
        )

    def _after_stream_failure(
        self, *, state: _StreamState, err: LLMError, attempt: int
    ) -> tuple[float | None, LLMError]:
        """Decide what a failed stream attempt means. Returns (delay, err): delay 0 means
        "retry at once, not counted", None means raise err."""
        if state.emitted:
            interrupted = StreamInterrupted(
                f"LLM stream interrupted after partial output: {err}",
                partial=state.text,
                status=err.status,
            )
            return None, interrupted
        if self._send_stream_options and self._codec.rejects_stream_options(err):
            self._send_stream_options = False
            logger.warning("llm_stream_options_rejected url=%s", self._url)
            return 0.0, err
        return self._retry.delay(attempt=attempt, err=err), err

    def stream_chat(
        self,
        *,
        messages: list[Message],
        model: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Iterator[StreamEvent]:
        attempt = 0
        while True:
            state = _StreamState()
            body = self._stream_body(messages=messages, model=model, tools=tools)
            try:
                with self._client.stream(
                    "POST", self._url, json=body, headers=self._stream_headers()
                ) as response:
                    if response.status_code != 200:
                        raise self._codec.error_from_response(
                            status=response.status_code,
                            raw=response.read(),
                            headers=response.headers,
                        )
                    if self._codec.is_json_response(response):
                        completion = self._codec.completion(
                            raw=response.read(), requested_model=body.get("model", "")
                        )
                        yield from self._codec.events_from_completion(completion)
                        return
                    for line in response.iter_lines():
                        text = state.feed_line(line)
                        if text:
                            state.emitted = True
                            yield StreamEvent(kind="delta", text=text)
                        if state.done:
                            break
                    state.end_of_input()
                    if not state.complete:
                        raise self._codec.unfinished_stream()
                yield state.final_event()
                return
            except httpx.HTTPError as exc:
                err = transport_error(exc)
                cause: BaseException = exc
            except LLMError as exc:
                err = cause = exc
            delay, err = self._after_stream_failure(state=state, err=err, attempt=attempt)
            if delay is None:
                raise err from (cause if cause is not err else None)
            if delay > 0:
                _log_retry(attempt=attempt, delay=delay, err=err, url=self._url)
                time.sleep(delay)
                attempt += 1

    async def astream_chat(
        self,
        *,
        messages: list[Message],
        model: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[StreamEvent]:
        client = self._aclient()
        attempt = 0
        while True:
            state = _StreamState()
            body = self._stream_body(messages=messages, model=model, tools=tools)
            try:
                async with client.stream(
                    "POST", self._url, json=body, headers=self._stream_headers()
                ) as response:
                    if response.status_code != 200:
                        raise self._codec.error_from_response(
                            status=response.status_code,
                            raw=await response.aread(),
                            headers=response.headers,
                        )
                    if self._codec.is_json_response(response):
                        completion = self._codec.completion(
                            raw=await response.aread(), requested_model=body.get("model", "")
                        )
                        for event in self._codec.events_from_completion(completion):
                            yield event
                        return
                    lines = _SSELines()
                    # Raw bytes unless the server compressed anyway: one generator less than
                    # aiter_bytes, per chunk (a chunk is a token).
                    encoding = response.headers.get("content-encoding", "identity")
                    chunks = (
                        response.aiter_raw()
                        if encoding.strip().lower() in ("", "identity")
                        else response.aiter_bytes()
                    )
                    async for chunk in chunks:
                        for event in state.deltas(lines.feed(chunk)):
                            yield event
                        if state.done:
                            break
                    else:
                        for event in state.deltas(lines.close()):
                            yield event
                    state.end_of_input()
                    if not state.complete:
                        raise self._codec.unfinished_stream()
                yield state.final_event()
                return
            except httpx.HTTPError as exc:
                err = transport_error(exc)
                cause: BaseException = exc
            except LLMError as exc:
                err = cause = exc
            delay, err = self._after_stream_failure(state=state, err=err, attempt=attempt)
            if delay is None:
                raise err from (cause if cause is not err else None)
            if delay > 0:
                _log_retry(attempt=attempt, delay=delay, err=err, url=self._url)
                await asyncio.sleep(delay)
                attempt += 1
