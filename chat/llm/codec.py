"""The wire format of OpenAI-compatible chat completions, with no I/O: request bodies, response
and stream parsing (`_StreamState`, `_SSELines`), error classification (which failure is a
context overflow, which is worth a retry). chat/llm/openai_compat.py does the I/O, sync and
async alike, around it."""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from chat.llm.base import (
    Completion,
    ContextLengthExceeded,
    EmptyStream,
    LLMError,
    Message,
    StreamEvent,
    ToolCall,
    Usage,
    is_summary_request,
)
from chat.llm.reasoning import ThinkSplitter, strip_think
from chat.llm.special import messages_neutralised

_TOOLS_REFUSED = re.compile(
    r"\btool(s|_choice|_calls?)?\b.*\b(support|unrecognized|not allowed|unknown|invalid)"
    r"|\b(support|unrecognized|not allowed|unknown|invalid)\b.*\btool(s|_choice)?\b",
    re.IGNORECASE | re.DOTALL,
)

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


def request_content(body: dict[str, Any]) -> bytes:
    """`body` as the JSON a request carries. orjson: a send's payload is up to the whole input
    budget (48k characters by default), encoded before the model call and so before the
    first token; the stdlib took ~0.15 ms for it, orjson ~0.005 ms. What orjson refuses (an
    integer past 64 bits in a tool's arguments) falls back to the stdlib."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


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
        #: Chunks parsed, [DONE] included: none at all is how a llama.cpp-based server says the
        #: prompt does not fit (EmptyStream).
        self.chunks = 0
        self._visible = ThinkSplitter()

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
            self.chunks += 1
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

    def end_of_input(self) -> str:
        """The text still held when the body ends (a last chunk without its blank line, a
        reply too short to tell from a think tag): the caller sends it as a last delta."""
        text = self._flush_pending()
        tail = self._visible.flush()
        if tail:
            self.text_parts.append(tail)
        return text + tail

    def _flush_pending(self) -> str:
        if not self._pending:
            return ""
        data = "\n".join(self._pending)
        self._pending = []
        if data.strip() == "[DONE]":
            self.done = True
            self.chunks += 1
            return ""
        try:
            chunk = orjson.loads(data)
        except ValueError as exc:
            raise LLMError(f"LLM stream carried invalid JSON: {_snippet(data)}") from exc
        return self._apply(chunk)

    def _apply(self, chunk: Any) -> str:
        self.chunks += 1
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
            text = self._visible.feed(text)
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
        # Control tokens made inert in every text, whoever wrote it (chat/llm/special.py).
        body: dict[str, Any] = {"messages": messages_neutralised(messages)}
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

    @staticmethod
    def rejects_tools(err: LLMError) -> bool:
        # "llama3 does not support tools" (Ollama), "tools is not supported", "Unrecognized
        # request argument supplied: tools", "tool_choice ... not allowed" (vLLM without
        # --enable-auto-tool-choice).
        return err.status in (400, 422, 501) and _TOOLS_REFUSED.search(str(err)) is not None

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
            text=strip_think(content) if isinstance(content, str) else "",
            tool_calls=tool_calls,
            finish_reason=choice.get("finish_reason"),
            usage=_usage(data.get("usage")),
            model=str(data.get("model") or requested_model),
        )

    @staticmethod
    def unfinished_stream(state: _StreamState) -> LLMError:
        message = "LLM stream ended before the reply was complete"
        if state.chunks == 0:
            return EmptyStream(f"{message} (not one event: the prompt may not fit)", retryable=True)
        return LLMError(message, retryable=True)

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
