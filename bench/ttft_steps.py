"""Where a REST send's time to first token goes, step by step, through the real server: the
app under Daphne as `python -m cadau.serve` runs it, with a timestamp written at each step of
every `POST /api/v1/chat/send` (bench/ttft.py runs it after its timed cells).

    python -m bench.ttft_steps -b 127.0.0.1 -p PORT cadau.asgi:application   # the server

The steps are marked by wrapping the functions that take them (in this process only: nothing
in the app knows). Timestamps are CLOCK_MONOTONIC (time.perf_counter_ns on Linux), which the
client's share: each step is read as milliseconds after the client sent the request. Marks go
to the file named by BENCH_STEPS_LOG, a line each."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any, TextIO, cast

SEND_PATH = "/api/v1/chat/send"
# REST sends per kind of session (bench/ttft.py), after two untimed rounds.
STEPS_SENDS = int(os.environ.get("BENCH_STEPS_SENDS", "10"))
# (mark, what it is), in the order a send takes them; the client adds "sent" and "received".
STEPS = [
    ("arrived", "request at the ASGI app"),
    ("view", "view entered (middleware, authentication, throttles done)"),
    ("prepare", "checks and store done, prepare starts"),
    ("prepared", "payload built (recall included)"),
    ("returned", "view returned"),
    ("headers", "response headers out"),
    ("model", "model called"),
    ("model_first", "model's first token in"),
    ("out", "first token handed to the response"),
]


def _instrument(log: TextIO) -> None:
    """Wrap the steps' functions; `log` gets a line "<mark> <ns>" per step."""
    import cadau.asgi as asgi
    import chat.api.send as send_view
    import chat.turn.service as service
    from chat.llm.openai_compat import OpenAICompatProvider

    def mark(name: str) -> None:
        log.write(f"{name} {time.perf_counter_ns()}\n")

    app = asgi.application

    async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path") != SEND_PATH:
            return await app(scope, receive, send)
        mark("arrived")

        async def noted(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                mark("headers")
            await send(message)

        return await app(scope, receive, noted)

    asgi.application = application

    post = send_view.SendView.post

    def view(self: Any, request: Any) -> Any:
        mark("view")
        try:
            return post(self, request)
        finally:
            mark("returned")

    send_view.SendView.post = view  # type: ignore[method-assign]

    prepare = service.turn_prepare

    def prepared(turn: Any) -> Any:
        mark("prepare")
        try:
            return prepare(turn)
        finally:
            mark("prepared")

    service.turn_prepare = prepared

    sse = send_view._sse
    # The responses that wrote their first delta: each response's events are written by its
    # own task.
    marked: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()

    def written(event: dict[str, Any]) -> bytes:
        task = asyncio.current_task()
        if event.get("type") == "delta" and task is not None and task not in marked:
            marked.add(task)
            mark("out")
        return sse(event)

    send_view._sse = written

    stream = OpenAICompatProvider.astream_chat

    async def model(self: Any, **kwargs: Any) -> AsyncIterator[Any]:
        mark("model")
        seen = False
        # Closed with this wrapper (a cancelled reply closes its stream at once).
        async with aclosing(cast(AsyncGenerator[Any, None], stream(self, **kwargs))) as events:
            async for event in events:
                if not seen and event.kind == "delta" and event.text:
                    seen = True
                    mark("model_first")
                yield event

    OpenAICompatProvider.astream_chat = model  # type: ignore[method-assign]


def steps_marks(log_path: Path) -> list[dict[str, int]]:
    """The server's marks, one dict per send in the order they arrived (a send's marks start
    at its "arrived")."""
    groups: list[dict[str, int]] = []
    for line in log_path.read_text().splitlines():
        name, _, ns = line.partition(" ")
        if not ns.isdigit():
            raise RuntimeError(f"{log_path}: not a mark: {line!r}")
        if name == "arrived":
            groups.append({})
        if groups:
            groups[-1].setdefault(name, int(ns))
    return groups


def steps_medians(sends: list[tuple[int, int, dict[str, int]]]) -> dict[str, float]:
    """Each step's median in ms after "sent", over `sends` ((sent, received, marks) each)."""
    out: dict[str, float] = {}
    for name in [*(name for name, _ in STEPS), "received"]:
        values = [
            ((received if name == "received" else marks[name]) - sent) / 1e6
            for sent, received, marks in sends
            if name == "received" or name in marks
        ]
        if values:
            out[name] = statistics.median(values)
    return out


def main() -> None:
    # Before Django's setup: the loop policy (uvloop), as cadau.serve sets it on import.
    import cadau.serve as serve

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    import django

    django.setup()
    with open(os.environ["BENCH_STEPS_LOG"], "a", buffering=1) as log:
        _instrument(log)
        serve.startup_sweep()  # as `python -m cadau.serve` does
        serve.main(sys.argv[1:])


if __name__ == "__main__":
    main()
