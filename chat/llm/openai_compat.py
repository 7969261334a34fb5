"""Client for any OpenAI-compatible chat-completions endpoint (OpenAI, DeepSeek, Qwen, vLLM,
Ollama, llama.cpp server).

The wire format lives in chat/llm/codec.py (`_Codec`, `_StreamState`), which does no I/O, so
the two calls here only send and wait: `complete` is sync (httpx.Client: summaries run in
worker threads), `astream_chat` async (httpx.AsyncClient: replies stream in consumers).
Retry decisions live in `_RetryPolicy` for the same reason.

Retries: connect errors, timeouts and 408/429/5xx are retried with exponential backoff and
jitter, but only while nothing has reached the caller. Once a delta has been yielded a retry
would make the model say things twice, so a broken stream raises StreamInterrupted with the
partial text instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from chat.llm import slots
from chat.llm.base import (
    Completion,
    LLMError,
    Message,
    Preempted,
    StreamEvent,
    StreamInterrupted,
)
from chat.llm.codec import (  # noqa: F401 - classify_error, _SSELines: part of this module's surface
    _Codec,
    _SSELines,
    _StreamState,
    classify_error,
    request_content,
    transport_error,
)
from chat.llm.transport import AiohttpTransport, loop_is_long_lived

logger = logging.getLogger("chat.llm")


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
        summary_timeout_seconds: float | None = None,
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
        # `complete` (the summarising call) waits for a whole answer before its first byte: a
        # small server writing a summary takes longer than any gap between a reply's tokens.
        self._connect_timeout = connect_timeout_seconds
        self.summary_timeout_seconds = summary_timeout_seconds or timeout_seconds
        self._limits = httpx.Limits(max_connections=1000, max_keepalive_connections=50)
        self._headers = {"Accept": "application/json", "User-Agent": "cadau"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        # The request bodies are encoded here (codec.request_content), not by httpx's json=.
        self._json_headers = {**self._headers, "Content-Type": "application/json"}
        self._client = httpx.Client(timeout=self._timeout, limits=self._limits)
        # An AsyncClient is bound to the event loop that first used it; Django runs several
        # loops (per thread, per test), so each loop gets its own.
        self._async_clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, httpx.AsyncClient
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        # Flipped off for good the first time the server rejects `stream_options`, or `tools`
        # (Ollama models without tool support, some llama.cpp builds): one provider per base
        # URL, so the server is asked once, not on every send.
        self._send_stream_options = True
        self._send_tools = True

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
        return {**self._json_headers, "Accept": "text/event-stream", "Accept-Encoding": "identity"}

    def models_listing(self) -> Any:
        """GET /models: what the server says it serves (chat/llm/window.py reads windows from
        it). Short timeouts and no retries: nobody waits on it."""
        response = self._client.get(
            f"{self.base_url}/models", headers=self._headers, timeout=httpx.Timeout(3.0)
        )
        response.raise_for_status()
        return response.json()

    # --- non-streaming -------------------------------------------------------------------

    def complete(
        self,
        *,
        messages: list[Message],
        model: str | None = None,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        temperature: float | None = None,
        timeout: float | None = None,
    ) -> Completion:
        """`timeout`: seconds to wait for the answer; the summary timeout unless given."""
        wait = httpx.Timeout(
            timeout or self.summary_timeout_seconds,
            connect=self._connect_timeout,
            pool=self._connect_timeout,
        )
        body = self._codec.body(
            messages=messages,
            model=model,
            stream=False,
            max_tokens=max_tokens,
            tools=tools if self._send_tools else None,
            temperature=temperature,
        )
        if slots.in_background():
            return self._complete_yielding(body=body, wait=wait)
        attempt = 0
        while True:
            try:
                response = self._client.post(
                    self._url,
                    content=request_content(body),
                    headers=self._json_headers,
                    timeout=wait,
                )
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
            if self._tools_refused(body=body, err=err):
                continue
            delay = self._retry.delay(attempt=attempt, err=err)
            if delay is None:
                raise err from (cause if cause is not err else None)
            _log_retry(attempt=attempt, delay=delay, err=err, url=self._url)
            time.sleep(delay)
            attempt += 1

    def _complete_yielding(self, *, body: dict[str, Any], wait: httpx.Timeout) -> Completion:
        """`complete` as background work on a one-slot server (chat/llm/slots.py): streamed,
        so that it can give the server up the moment a reply needs it. Its socket is shut when
        a reply starts in this process (a blocked read ends at once), and it looks for replies
        in other processes between chunks; llama-cpp-python ends the stream by itself when the
        reply's request arrives ([DONE] without a finish reason). Each is `Preempted`. Not
        retried: a failure here is the background work's, which happens again later."""
        body = {**body, "stream": True}
        if self._send_stream_options:
            body["stream_options"] = {"include_usage": True}
        held: list[socket.socket] = []
        gave_up = threading.Event()

        def abort() -> None:
            gave_up.set()
            for sock in held:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        preempted = Preempted("a reply needs the one-slot model server: the summary gave it up")
        with slots.yielding(abort) as reply_waiting:
            if reply_waiting():
                raise preempted
            try:
                state = self._stream_read(
                    body=body, wait=wait, held=held, gave_up=gave_up, stop=reply_waiting
                )
            except httpx.HTTPError as exc:
                if gave_up.is_set():
                    raise preempted from exc
                raise transport_error(exc) from exc
            if isinstance(state, Completion):
                return state
            if gave_up.is_set() or reply_waiting() or (state.done and not state.finish_reason):
                raise preempted
        state.end_of_input()
        if not state.complete:
            raise self._codec.unfinished_stream(state)
        final = state.final_event()
        return Completion(
            text=final.text,
            tool_calls=final.tool_calls,
            finish_reason=final.finish_reason,
            usage=final.usage,
            model=str(body.get("model") or ""),
        )

    def _stream_read(
        self,
        *,
        body: dict[str, Any],
        wait: httpx.Timeout,
        held: list[socket.socket],
        gave_up: threading.Event,
        stop: Callable[[], bool],
    ) -> _StreamState | Completion:
        """One streamed call read to its end, or until `stop()` says so between chunks; its
        socket goes into `held` as soon as the headers are in, for `abort` to shut."""
        state, lines = _StreamState(), _SSELines()
        with self._client.stream(
            "POST",
            self._url,
            content=request_content(body),
            headers=self._stream_headers(),
            timeout=wait,
        ) as response:
            network = response.extensions.get("network_stream")
            sock = network.get_extra_info("socket") if network is not None else None
            if sock is not None:
                held.append(sock)
            if gave_up.is_set():
                return state
            if response.status_code != 200:
                raise self._codec.error_from_response(
                    status=response.status_code, raw=response.read(), headers=response.headers
                )
            if self._codec.is_json_response(response):
                return self._codec.completion(
                    raw=response.read(), requested_model=body.get("model", "")
                )
            for chunk in response.iter_raw():
                for _ in state.deltas(lines.feed(chunk)):
                    pass
                if state.done or stop():
                    return state
            for _ in state.deltas(lines.close()):
                pass
        return state

    # --- streaming -----------------------------------------------------------------------

    def _stream_body(
        self, *, messages: list[Message], model: str | None, tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        return self._codec.body(
            messages=messages,
            model=model,
            stream=True,
            include_usage=self._send_stream_options,
            tools=tools if self._send_tools else None,
        )

    def _tools_refused(self, *, body: dict[str, Any], err: LLMError) -> bool:
        """True when the server refused the request for its `tools`: they are dropped from
        `body` and from every later request to this server, and the call is retried at once.
        The model then answers without tools, which beats no answer."""
        if not body.get("tools") or not self._codec.rejects_tools(err):
            return False
        self._send_tools = False
        body.pop("tools", None)
        body.pop("tool_choice", None)
        logger.warning("llm_tools_rejected url=%s", self._url)
        return True

    def _after_stream_failure(
        self, *, state: _StreamState, err: LLMError, attempt: int, body: dict[str, Any]
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
        if self._tools_refused(body=body, err=err):
            return 0.0, err
        return self._retry.delay(attempt=attempt, err=err), err

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
                    "POST", self._url, content=request_content(body), headers=self._stream_headers()
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
                    tail = state.end_of_input()
                    if tail:
                        state.emitted = True
                        yield StreamEvent(kind="delta", text=tail)
                    if not state.complete:
                        raise self._codec.unfinished_stream(state)
                yield state.final_event()
                return
            except httpx.HTTPError as exc:
                err = transport_error(exc)
                cause: BaseException = exc
            except LLMError as exc:
                err = cause = exc
            delay, err = self._after_stream_failure(
                state=state, err=err, attempt=attempt, body=body
            )
            if delay is None:
                raise err from (cause if cause is not err else None)
            if delay > 0:
                _log_retry(attempt=attempt, delay=delay, err=err, url=self._url)
                await asyncio.sleep(delay)
                attempt += 1
