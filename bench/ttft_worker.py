"""The Django half of the time-to-first-token benchmark (bench/ttft.py), run as a subprocess with
DATABASE_URL (and the LLM settings) of one bench database:

    python -m bench.ttft_worker prepare --sizes 1000,100000 --fresh 30
    python -m bench.ttft_worker unsummarise --session-id 12
    python -m bench.ttft_worker inside < plan.json

Each prints one JSON document on stdout; progress goes to stderr."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import django

from bench.dbstats import statistics_refreshed

USER = "bench-ttft"
# Not a secret: a throwaway account in a throwaway database that only loopback can reach.
PASSWORD = "bench-password-not-a-secret"
# What a long conversation's summary weighs (the default CHAT_CONTEXT_SUMMARY_MAX_RUNES), and
# how many messages stay verbatim after it: a session "with a full summary".
SUMMARY_RUNES = 6000
VERBATIM_TAIL = 40
IMPORTED_SIZE = 100_000

# Every query of the process, from every thread: (perf_counter, thread name).
_queries: list[tuple[float, str]] = []
_queries_lock = threading.Lock()


def _count(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
    with _queries_lock:
        _queries.append((time.perf_counter(), threading.current_thread().name))
    return execute(sql, params, many, context)


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    django.setup()
    from django.db.backends.signals import connection_created

    def counted(sender: Any, connection: Any, **kwargs: Any) -> None:
        # Pooled connections are "created" at every checkout: one counter per connection.
        if _count not in connection.execute_wrappers:
            connection.execute_wrappers.append(_count)

    # Before any connection opens: the worker threads' connections get the counter too.
    connection_created.connect(counted, weak=False)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _summary_text() -> str:
    line = (
        "## Facts and decisions\n- The invoice parser keeps totals in cents; ticket #4411 "
        "tracks the rounding bug in /srv/app/parse.py.\n"
    )
    return (line * (SUMMARY_RUNES // len(line) + 1))[:SUMMARY_RUNES]


def _summarised(session: Any) -> None:
    """A full summary, and the anchor so that the last VERBATIM_TAIL messages (from a question
    on) stay verbatim: what a long chat looks like after its compactions."""
    from chat.models import ChatMessage, ChatSession, MessageRole

    tail = list(
        ChatMessage.objects.filter(session=session)
        .order_by("-id")
        .values_list("id", "role")[:VERBATIM_TAIL]
    )
    anchor = next(mid for mid, role in reversed(tail) if role == MessageRole.USER)
    ChatSession.objects.filter(pk=session.pk).update(
        context_summary=_summary_text(), verbatim_since_message_id=anchor
    )


def unsummarise(*, session_id: int) -> dict[str, Any]:
    """Back to how an import or seed_demo leaves a session: no summary at all, and none of the
    messages earlier imported sends added (their short exchanges piled up at the session's end
    run after run, until its newest 200 rows no longer filled the budget: a second page of
    tail read that a session as imported does not need)."""
    from django.db.models import F

    from chat.models import ChatMessage, ChatSession

    added = (
        ChatMessage.objects.filter(session_id=session_id)
        .order_by("id")
        .values_list("id", flat=True)[IMPORTED_SIZE : IMPORTED_SIZE + 1]
    )
    if added:
        ChatMessage.objects.filter(session_id=session_id, id__gte=added[0]).delete()
    ChatSession.objects.filter(pk=session_id).update(
        message_count=ChatMessage.objects.filter(session_id=session_id).count(),
        context_summary="",
        verbatim_since_message_id=None,
        context_version=F("context_version") + 1,
        # Its rows changed (the earlier sends' are deleted): recall's kept window of them is
        # read again, as a freshly imported session's first send reads it.
        messages_version=F("messages_version") + 1,
        compaction_lease_token="",
        compaction_lease_until=None,
    )
    _vacuumed()
    return {"ok": True}


def _vacuumed() -> None:
    """This machine's PostgreSQL runs with autovacuum off. The previous send's compaction
    updated the session row once per chunk, and thousands of dead versions of it made every
    read of the row slower (a session read took ~2 ms): an artifact of sending to the same
    session again and again, not something a freshly imported session carries, and what
    autovacuum clears in production. chat_messages too: the earlier sends' rows just deleted
    (unsummarise) would otherwise sit dead at the top of the session's index, where the tail
    read starts."""
    from django.db import connection

    if connection.vendor == "postgresql":
        statistics_refreshed(tables=("chat_sessions", "chat_messages"))


def prepare(*, sizes: list[int], fresh: int, label: str) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from rest_framework.authtoken.models import Token

    from chat.management.commands.seed_demo import seed_session
    from chat.models import ChatMessage, ChatSession

    call_command("migrate", verbosity=0, interactive=False)
    user, _ = get_user_model().objects.get_or_create(username=USER)
    user.set_password(PASSWORD)
    user.save(update_fields=["password"])
    sessions: dict[str, Any] = {}
    for size, title in [(s, f"ttft-{s}") for s in sizes] + [(IMPORTED_SIZE, "ttft-imported")]:
        existing = ChatSession.objects.filter(owner=user, title=title).order_by("id").first()
        # Earlier runs added their sends: only a session below its size is rebuilt.
        if existing is None or existing.message_count < size:
            if existing is not None:
                ChatMessage.objects.filter(session=existing).delete()
                existing.delete()
            _log(f"[{label}] building {title} ({size:,} messages) ...")
            built = seed_session(user=user, messages=size, title=title)
            existing = ChatSession.objects.get(pk=built.session_id)
        if title == "ttft-imported":
            unsummarise(session_id=existing.pk)
        else:
            _summarised(existing)
        sessions[title.removeprefix("ttft-")] = existing.pk
    ChatSession.objects.filter(owner=user, title="ttft-fresh").delete()
    sessions["fresh"] = [
        ChatSession.objects.create(owner=user, title="ttft-fresh").pk for _ in range(fresh)
    ]
    statistics_refreshed()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            version = f"PostgreSQL {cursor.fetchone()[0]}"
        else:
            cursor.execute("SELECT sqlite_version()")
            version = f"SQLite {cursor.fetchone()[0]}"
    client = Client()
    client.force_login(user)
    token, _ = Token.objects.get_or_create(user=user)
    return {
        "sessions": sessions,
        "server_version": version,
        "cookie": client.cookies["sessionid"].value,
        "token": token.key,
    }


# --- inside the server: queries per send, and where the time goes ----------------------------

_spans: dict[str, list[float]] = {}


def _timed(owner: Any, name: str, label: str) -> None:
    """Wrap `owner.name` (sync or async) to record its duration under `label`."""
    import inspect

    original = getattr(owner, name)
    if inspect.iscoroutinefunction(original):

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                _spans.setdefault(label, []).append((time.perf_counter() - started) * 1000)

        setattr(owner, name, async_wrapper)
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _spans.setdefault(label, []).append((time.perf_counter() - started) * 1000)

    setattr(owner, name, wrapper)


_server_loop: Any = None


def _loop() -> Any:
    """One loop for every send, marked as a server's: the model client then keeps its pooled
    connections between sends, as under Daphne (a loop per send would connect every time)."""
    global _server_loop
    if _server_loop is None:
        import asyncio

        from chat.llm.transport import mark_loop_long_lived

        _server_loop = asyncio.new_event_loop()
        mark_loop_long_lived(_server_loop)
    return _server_loop


def _send(*, client: Any, session_id: int, content: str) -> dict[str, Any]:
    """One REST SSE send through the real view, in-process: time to the first delta, queries
    before it and in all (every thread), and the reply's own figures."""
    import asyncio

    from chat.turn import service
    from devtools.introspect import background_wait

    first_delta = 0.0
    done: dict[str, Any] = {}
    with _queries_lock:
        _queries.clear()
    started = time.perf_counter()
    response = client.post(
        "/api/v1/chat/send",
        {"session_id": session_id, "content": content},
        content_type="application/json",
        HTTP_ACCEPT="text/event-stream",
    )

    async def read() -> None:
        nonlocal first_delta, done
        async for chunk in response.streaming_content:
            for line in chunk.decode().splitlines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event["type"] == "delta" and not first_delta:
                    first_delta = time.perf_counter()
                elif event["type"] == "done":
                    done = event
        # The reply's after-reply work too, before this loop ends (a server's loop lives on).
        await asyncio.gather(*list(service._tasks), return_exceptions=True)

    _loop().run_until_complete(read())
    background_wait()
    with _queries_lock:
        before = sum(1 for at, _ in _queries if at < first_delta)
        total = len(_queries)
    metadata = done.get("message", {}).get("metadata", {})
    return {
        "ttft_ms": (first_delta - started) * 1000 if first_delta else None,
        "queries_before_first_token": before,
        "queries": total,
        "summary_calls_waited": metadata.get("summary_calls_waited"),
        "rows_read": metadata.get("rows_read"),
    }


def inside(*, plan: dict[str, Any]) -> dict[str, Any]:
    """Sends through the real view in this process, each kind of session in turn: queries per
    send, and the time of each step on the way to the first token."""
    from django.test import Client

    import chat.api.send as send_view
    import chat.turn.service as service
    from chat.llm.openai_compat import OpenAICompatProvider

    _timed(send_view, "turn_send", "checks, store and prepare")
    _timed(service, "turn_prepare", "prepare: hooks, tail read, payload")
    first_chunk: list[float] = []
    stream = OpenAICompatProvider.astream_chat

    async def timed_stream(self: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        seen = False
        async for event in stream(self, **kwargs):
            if not seen and event.kind == "delta" and event.text:
                seen = True
                first_chunk.append((time.perf_counter() - started) * 1000)
            yield event

    OpenAICompatProvider.astream_chat = timed_stream  # type: ignore[method-assign]

    client = Client(HTTP_AUTHORIZATION=f"Token {plan['token']}")
    results: dict[str, Any] = {}
    for kind, session_ids in plan["sessions"].items():
        runs = []
        for i in range(plan["sends"] + 1):
            sid = (
                session_ids[i % len(session_ids)] if isinstance(session_ids, list) else session_ids
            )
            if i == 0:  # warm: first-call imports and connections are not the send
                _send(client=client, session_id=sid, content="warm up")
                _spans.clear()
                first_chunk.clear()
                continue
            runs.append(_send(client=client, session_id=sid, content=f"inside {kind} {i}"))
        results[kind] = {
            "runs": runs,
            "spans": {k: list(v) for k, v in _spans.items()},
            "model_first_chunk_ms": list(first_chunk),
        }
        _spans.clear()
        first_chunk.clear()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ttft_worker")
    sub = parser.add_subparsers(dest="task", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--sizes", required=True)
    p.add_argument("--fresh", type=int, required=True)
    p.add_argument("--label", required=True)
    u = sub.add_parser("unsummarise")
    u.add_argument("--session-id", type=int, required=True)
    sub.add_parser("inside")
    args = parser.parse_args()
    _setup()
    if args.task == "prepare":
        result: Any = prepare(
            sizes=[int(s) for s in args.sizes.split(",")], fresh=args.fresh, label=args.label
        )
    elif args.task == "unsummarise":
        result = unsummarise(session_id=args.session_id)
    else:
        result = inside(plan=json.load(sys.stdin))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
