"""The fake LLM server's state and its Python control API (`FakeLLMServer`); the HTTP side is
in handler.py. Package docstring: what it serves and how calls are told apart."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Literal

from chat.llm.base import Message, is_summary_request
from devtools.fakellm.handler import Admission, Handler, HTTPServer
from devtools.fakellm.pacer import Pacer
from devtools.fakellm.scripts import (
    Call,
    Fault,
    ScriptedReply,
    ServerConfig,
    Target,
    estimate_prompt_tokens,
)


class FakeLLMServer:
    """See the package docstring (devtools/fakellm/__init__.py). Thread-safe; use as a
    context manager or start()/stop()."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, token_ms: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._httpd = HTTPServer((host, port), Handler)
        self._httpd.fake = self
        self._thread: threading.Thread | None = None
        self._default_token_ms = token_ms
        self.pacer = Pacer()
        # Handlers waiting for a slot; outlives reset(), as their threads do.
        self._waiting = 0
        self._init_state()

    def _init_state(self) -> None:
        self._scripts: dict[str, deque[ScriptedReply]] = {"chat": deque(), "summary": deque()}
        self._faults: list[Fault] = []
        self._calls: list[Call] = []
        self._config = ServerConfig(token_ms=self._default_token_ms)
        self._slots: threading.Semaphore | None = None
        # Hanging handlers wait on this; reset()/stop() set it so no thread outlives a test.
        self._release = threading.Event()
        # /v1/embeddings (devtools/fakellm/embeddings.py): each call's inputs, failures to come.
        self._embedding_inputs: list[list[str]] = []
        self._embedding_failures = 0
        self._embedding_fail_status = 500
        self._embedding_delay = 0.0
        self._embedding_max_words = 0
        self.embedding_per_token = False

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

    def release(self) -> None:
        """Wake the handlers hanging on a `hang` fault now (they then answer as usual), and keep
        everything else: a test holds a call in flight with `fail_next("hang", seconds=...)`,
        does something meanwhile, then lets the call finish."""
        with self._lock:
            self._release.set()
            self._release = threading.Event()

    def script(
        self,
        *replies: str | dict[str, Any] | ScriptedReply,
        target: Literal["chat", "summary"] = "chat",
        replace: bool = False,
    ) -> None:
        """Queue replies for the next calls of `target` kind, in order. `replace`: instead of
        what is still queued (a driver scripting each call just before making it stays in step
        even when a call never reached the model)."""
        if target not in ("chat", "summary"):
            raise ValueError("target must be 'chat' or 'summary'")
        coerced = [ScriptedReply.coerce(r) for r in replies]
        with self._lock:
            if replace:
                self._scripts[target].clear()
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

    def configure(self, **changes: Any) -> None:
        """Change how the server answers every call (ServerConfig's fields); a value of None
        leaves that setting unchanged.

        token_ms: delay between streamed tokens. reply_words: pad default chat replies to this
        many words (benchmarks want fixed-size replies; 0 turns it off).
        reject_stream_options / reject_tools: answer 400 to requests carrying them, like
        servers that do not know them. require_api_key: 401 unless `Authorization: Bearer
        <key>` ("" turns it off). usage=False: never report usage, as servers that ignore
        `stream_options` do. context_window: the window /v1/models reports and, with
        context_overflow (default "overflow_cut"; "" turns it off), enforces on the prompt's
        estimated tokens (0 turns both off). train_context_window: llama.cpp's n_ctx_train.
        slots: requests answered at once (1: single-slot server, the others wait; 0:
        unlimited). interrupt_requests: with slots, a request that has to wait ends the
        running stream early, as llama-cpp-python does by default. summary_style: how
        unscripted summary calls are answered (summaries.py: "digest", "fail", "unusable",
        "vague", "good")."""
        unknown = set(changes) - set(ServerConfig.__slots__)
        if unknown:
            raise TypeError(f"unknown settings: {sorted(unknown)}")
        with self._lock:
            current = {k: getattr(self._config, k) for k in ServerConfig.__slots__}
            for key, value in changes.items():
                if value is None:
                    continue
                if key in ("reply_words", "context_window", "train_context_window"):
                    value = int(value) or None
                elif key in ("require_api_key", "context_overflow"):
                    value = str(value) or None  # "" turns it off
                current[key] = value
            config = ServerConfig(**current)  # validates
            if config.slots != self._config.slots:
                self._slots = threading.BoundedSemaphore(config.slots) if config.slots else None
            self._config = config

    @property
    def config(self) -> ServerConfig:
        with self._lock:
            return replace(self._config)

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

    def calls_json(self, *, since: int = 0, bodies: bool = True) -> dict[str, Any]:
        """The recorded calls as the control API lists them. The counts are of every call;
        `calls` holds those after call number `since`, without their bodies when `bodies` is
        False (a benchmark reading each new payload once needs no more)."""
        with self._lock:
            recorded = list(self._calls)
        return {
            "total": len(recorded),
            "chat": sum(1 for c in recorded if c.kind == "chat"),
            "summary": sum(1 for c in recorded if c.kind == "summary"),
            "calls": [c.as_json(body=bodies) for c in recorded[since:]],
        }

    # --- embeddings ----------------------------------------------------------------------

    def embeddings_fail(self, *, times: int = 1, status: int = 500) -> None:
        """The next `times` embeddings calls answer `status`."""
        with self._lock:
            self._embedding_failures += times
            self._embedding_fail_status = status

    def embeddings_delay(self, seconds: float) -> None:
        """Every embeddings call answers after `seconds` (0: at once)."""
        with self._lock:
            self._embedding_delay = seconds

    def embeddings_limit(self, words: int) -> None:
        """Refuse (400) a call with a text over `words` words, as llama-cpp-python refuses one
        over its batch size (0: no limit)."""
        with self._lock:
            self._embedding_max_words = words

    def embeddings_per_token(self, on: bool = True) -> None:
        """Answer as llama-cpp-python does for a model without pooling (SmolLM2 with
        --embedding): a vector per word, right for a batch's first text only."""
        with self._lock:
            self.embedding_per_token = on

    @property
    def embedding_inputs(self) -> list[list[str]]:
        """The inputs of every embeddings call so far, one list per call."""
        with self._lock:
            return [list(texts) for texts in self._embedding_inputs]

    def _embedding_admit(self, texts: list[str]) -> tuple[int, float, threading.Event]:
        """Record a call; (the status to fail it with or 0, delay, the event a reset wakes the
        delay with)."""
        with self._lock:
            self._embedding_inputs.append(texts)
            limit = self._embedding_max_words
            if limit and any(len(t.split()) > limit for t in texts):
                return 400, self._embedding_delay, self._release
            fail = self._embedding_failures > 0
            self._embedding_failures -= 1 if fail else 0
            status = self._embedding_fail_status if fail else 0
            return status, self._embedding_delay, self._release

    # --- per-request decisions (called from handler threads) -----------------------------

    @contextmanager
    def slot(self, slots: threading.Semaphore) -> Iterator[None]:
        """Hold one of the server's slots while answering (waiting for it, counted)."""
        with self._lock:
            self._waiting += 1
        try:
            slots.acquire()
        finally:
            with self._lock:
                self._waiting -= 1
        try:
            yield
        finally:
            slots.release()

    def someone_waiting(self) -> bool:
        with self._lock:
            return self._waiting > 0

    def _admit(
        self, *, body: dict[str, Any], raw_body: bytes, headers: dict[str, str]
    ) -> Admission:
        """Record the call and decide, atomically, which fault or script it gets."""
        raw = body.get("messages")
        messages: list[Message] = raw if isinstance(raw, list) else []
        kind: Literal["chat", "summary"] = "summary" if is_summary_request(messages) else "chat"
        prompt_tokens = estimate_prompt_tokens(messages)
        with self._lock:
            config = replace(self._config)
            index = len(self._calls) + 1
            fault = self._take_fault(kind=kind, index=index)
            overflow = fault is None and config.overflows(prompt_tokens)
            if overflow:
                assert config.context_overflow is not None
                fault = Fault(kind=config.context_overflow, status=400)
            # A request the server refuses before reading the prompt leaves the script for
            # the client's retry, as a real server's refusal leaves the conversation alone.
            refused = (
                not messages
                or (
                    bool(config.require_api_key)
                    and headers.get("authorization") != f"Bearer {config.require_api_key}"
                )
                or (config.reject_stream_options and "stream_options" in body)
                or (config.reject_tools and bool(body.get("tools")))
            )
            reply = None
            if not refused and (fault is None or fault.plays_script) and self._scripts[kind]:
                reply = self._scripts[kind].popleft()
            call = Call(
                index=index,
                kind=kind,
                raw_body=raw_body,
                headers=headers,
                stream=bool(body.get("stream")),
                fault=fault.kind if fault else None,
                received_at=time.time(),
            )
            self._calls.append(call)
            return Admission(
                call=call,
                fault=fault,
                overflow=overflow,
                reply=reply,
                prompt_tokens=prompt_tokens,
                config=config,
                release=self._release,
                slots=self._slots,
            )

    def _take_fault(self, *, kind: str, index: int) -> Fault | None:
        pinned = [f for f in self._faults if f.on_call == index and f.matches(kind=kind)]
        queued = [f for f in self._faults if f.on_call is None and f.matches(kind=kind)]
        for fault in pinned or queued[:1]:
            fault.times -= 1
            if fault.times <= 0 or fault.on_call is not None:
                self._faults.remove(fault)
            return fault
        return None
