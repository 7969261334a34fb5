"""`python -m bench ttft`: the time to the first token, the model's own against what a user of
Cadau waits, over REST server-sent events and the WebSocket, for a fresh session and for long
sessions with a full summary, on SQLite and PostgreSQL.

The app runs for real (Daphne in a subprocess, as `make run` serves it), the fake LLM server in
another; one client sends one message at a time and notes when the first `delta` arrives. The
model's own figure is the same client asking the fake server directly for a payload of the same
size. Data: seed_demo's generator, cached in .bench/ttft.sqlite3 and the PostgreSQL database
cadau_bench_ttft (bench/ttft_worker.py builds it)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.procs import ServerProcess, app_env, worker_run
from bench.ttft_report import REPLY_WORDS, DbRun, ttft_render
from bench.ttft_steps import STEPS_SENDS, steps_marks, steps_medians

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"
# Between opening the imported chat and sending to it: a user reads and writes for longer.
OPENED_PAUSE_SECONDS = 0.3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("ttft")
    group.add_argument("--ttft-sizes", default="1000,100000,1000000", help="summarised sessions")
    group.add_argument("--ttft-sends", type=int, default=30, help="timed sends per cell")
    group.add_argument("--ttft-imported-sends", type=int, default=10)
    group.add_argument("--ttft-databases", default="sqlite,postgres")
    group.add_argument(
        "--ttft-pg-url",
        default=os.environ.get(
            "BENCH_TTFT_PG_URL", "postgres://postgres@127.0.0.1:5432/cadau_bench_ttft"
        ),
    )


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _env(*, database_url: str, llm_url: str) -> dict[str, str]:
    return app_env(database_url, LLM_BASE_URL=llm_url, LLM_API_KEY="bench", LLM_MODEL="fake-chat")


def _worker(*args: str, env: dict[str, str], stdin: str | None = None) -> Any:
    return worker_run("bench.ttft_worker", *args, env=env, stdin=stdin)


def _probe(token: str, ask: str | None = None) -> str:
    """A timed send's text: a question in seed_demo's vocabulary (recall, which runs before the
    first token, matches it against many archived turns) with a token of its own that no turn
    holds (its rarest term: looked up in the search index below the recall window), or `ask`
    (the *recalling* and *asking for a kind* cells', _asks) after that token."""
    if ask is None:
        return f"ttft {token}: why does the retry logic time out with Redis when two workers run?"
    return f"ttft {token}: {ask}"


# The kinds an *asking for a kind* send asks for, each expanding to 2-400 WordNet members
# (chat/search/concepts.py): a new one each send, 57 of them (a cell asks 2 x (sends + 2)
# questions, 64 by default: the last few come back).
KINDS = (  # noqa: SIM905 (a word list)
    "databases languages servers tools editors errors files machines computers networks "
    "protocols vehicles fruits vegetables sports games books drinks metals medicines fabrics "
    "fish dogs cats cars boats planes trains hats weapons dances songs films movies plays poems "
    "paintings furniture toys dishes soups breads cheeses wines beers teas spices nuts grains "
    "rocks minerals jobs crafts hobbies exercises reptiles mammals"
).split()


def _recalling_asks(count: int) -> Iterator[str]:
    """The *recalling* cell's questions, the same every run: asking after an old turn by a rare
    term the archive holds far below recall's window ("step 118": seed_demo numbers the code a
    user pastes, so a three-digit number is in ~100 of a million messages, spread over all of
    them). Its lookup finds those, and their neighbours are read: the path a user asking about
    something said long ago takes, which the unmatched token never reaches. A new number every
    send: a term looked up once is kept for the session's next sends
    (chat/search/archive_window.py), and each user question is new."""
    for n in random.Random(2026).sample(range(100, 1000), count):
        yield f"what did I have at step {n}, where the retry logic timed out with Redis?"


def _kind_asks(count: int) -> Iterator[str]:
    """The *asking for a kind* cell's questions, the same every run: "which databases did we
    use ...": recall looks for the kind's members in its window (reading the window's words
    the first time a kind is asked of it), a new kind every send, as a kept one costs nothing."""
    kinds = random.Random(2026).sample(KINDS, len(KINDS))
    for i in range(count):
        yield f"which {kinds[i % len(kinds)]} did we use when the retry logic timed out with Redis?"


async def _model_ttft(client: httpx.AsyncClient, llm_url: str, payload_runes: int) -> float:
    body = {
        "model": "fake-chat",
        "stream": True,
        "messages": [
            {"role": "system", "content": "s" * (payload_runes // 2)},
            {"role": "user", "content": "u" * (payload_runes // 2)},
        ],
    }
    started = time.perf_counter()
    first = 0.0
    async with client.stream("POST", f"{llm_url}/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if first or not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                first = (time.perf_counter() - started) * 1000
    if not first:
        raise RuntimeError("the fake model sent no token")
    return first


async def _sse_send(
    client: httpx.AsyncClient, session_id: int, *, ask: str | None = None
) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    first = 0.0
    done: dict[str, Any] = {}
    body = {"session_id": session_id, "content": _probe(uuid.uuid4().hex[:8], ask)}
    headers = {"Accept": "text/event-stream"}
    async with client.stream("POST", "/api/v1/chat/send", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"send: HTTP {r.status_code} {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "delta" and not first:
                first = (time.perf_counter() - started) * 1000
            elif event["type"] == "done":
                done = event
    return first, done


async def _ws_send(ws: Any, *, ask: str | None = None) -> tuple[float, dict[str, Any]]:
    client_id = uuid.uuid4().hex
    frame = {"type": "send", "content": _probe(client_id[:8], ask), "client_id": client_id}
    started = time.perf_counter()
    first = 0.0
    ours = False  # the socket also saw the session's earlier sends (over REST): skip those
    await ws.send(json.dumps(frame))
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), timeout=120))
        if event["type"] == "message" and event["message"].get("client_id") == client_id:
            ours = True
        if not ours:
            continue
        if event["type"] == "delta" and not first:
            first = (time.perf_counter() - started) * 1000
        elif event["type"] == "done":
            return first, event
        elif event["type"] == "error":
            raise RuntimeError(f"socket error event: {event}")


async def _measure(
    *, run: DbRun, server: ServerProcess, llm_url: str, prepared: dict[str, Any], args: Any
) -> None:
    import websockets

    sessions = prepared["sessions"]
    ws_headers = {
        "Cookie": f"sessionid={prepared['cookie']}",
        "Origin": server.url,
    }
    sockets: dict[int, Any] = {}

    async def socket(session_id: int) -> Any:
        if session_id not in sockets:
            url = f"ws://127.0.0.1:{server.port}/ws/chat/{session_id}/"
            sockets[session_id] = await websockets.connect(url, additional_headers=ws_headers)
        return sockets[session_id]

    fresh = iter(sessions["fresh"])
    api = httpx.AsyncClient(
        base_url=server.url, timeout=120, headers={"Authorization": f"Token {prepared['token']}"}
    )
    model = httpx.AsyncClient(timeout=60)

    async def record(
        kind: str,
        transport: str,
        first: float,
        done: dict[str, Any],
        timed: bool,
    ) -> None:
        run.sends += 1
        metadata = done["message"]["metadata"]
        if metadata.get("summary_calls_waited"):
            run.waited += 1
        if timed:
            run.cells.setdefault((kind, transport), []).append(first)
            # The model's own, for a payload of the size this send's was, right after it.
            alone = await _model_ttft(model, llm_url, payload_runes=metadata["payload_runes"])
            run.model.setdefault((kind, transport), []).append(alone)

    try:
        await _round_robin(
            sends=args.ttft_sends,
            sessions=sessions,
            fresh=fresh,
            api=api,
            socket=socket,
            record=record,
        )
        await _imported_sends(
            run=run,
            server=server,
            imported=sessions["imported"],
            sends=args.ttft_imported_sends,
            fresh=fresh,
            api=api,
            socket=socket,
            record=record,
        )
    finally:
        for ws in sockets.values():
            await ws.close()
        await api.aclose()
        await model.aclose()


async def _imported_sends(
    *,
    run: DbRun,
    server: ServerProcess,
    imported: int,
    sends: int,
    fresh: Iterator[int],
    api: httpx.AsyncClient,
    socket: Callable[[int], Awaitable[Any]],
    record: Callable[..., Awaitable[None]],
) -> None:
    """`sends` first sends to the imported session as imported (each followed by a second
    while the compaction it started commits), and as many after opening it; two of each over
    REST, then two over the WebSocket, and so on."""
    for i in range(sends * 2):
        # Back to how an import leaves it before every send: each one is a first send.
        _worker("unsummarise", "--session-id", str(imported), env=server_env(server))
        transport = "REST SSE" if i % 4 < 2 else "WebSocket"
        # Every other time the chat is opened first, as its page does (the history's
        # newest page), and the user takes a moment to write: recall's window is read
        # then, not before the send's first token (chat/search/recall_warm.py).
        opened = i % 2 == 1
        if opened:
            page = await api.get("/api/v1/chat/history", params={"session_id": imported})
            page.raise_for_status()
            await asyncio.sleep(OPENED_PAUSE_SECONDS)
        # Untimed, to a fresh session: the server has been idle while the last compaction
        # settled, and a send after idle seconds is slower in every cell (cold caches and
        # threads: a summarised session's send took ~19 ms after 0.5 s idle, ~10 ms in the
        # round-robin). The imported cell measures the session's state, not the idle.
        await _sse_send(api, next(fresh))
        if transport == "REST SSE":
            sent = await _two_sends(lambda: _sse_send(api, imported))
        else:
            sent = await _two_sends(functools.partial(_ws_send, await socket(imported)))
        # Its summarising calls go to the same model server: the model's own figures are
        # taken once it ended.
        await _compaction_settled(api, imported)
        await record(
            "imported, opened first" if opened else "imported",
            transport,
            sent[0][1],
            sent[0][2],
            True,
        )
        if opened:
            continue  # its second send is the same as the other imported sends'
        run.compacting_sent += 1
        if await _committed_after(api, imported, wall=sent[1][0]):
            run.compacting_overlapped += 1
            await record("imported, compacting", transport, sent[1][1], sent[1][2], True)


async def _round_robin(
    *,
    sends: int,
    sessions: dict[str, Any],
    fresh: Iterator[int],
    api: httpx.AsyncClient,
    socket: Callable[[int], Awaitable[Any]],
    record: Callable[..., Awaitable[None]],
) -> None:
    """Two untimed rounds (first-call imports, connections, caches), then `sends` timed ones,
    each a send per cell over REST and over the WebSocket, round-robin over the cells: drift on
    this shared machine hits all of them alike."""
    sizes = [str(s) for s in sorted(int(k) for k in sessions if k.isdigit())]
    count = 2 * (sends + 2)
    # (cell, its session's key: None for a fresh one each send, its questions: None for the
    # probe's)
    cells: list[tuple[str, str | None, Iterator[str] | None]] = [
        ("fresh", None, None),
        *((size, size, None) for size in sizes),
    ]
    if sizes:
        cells.append((f"{sizes[-1]}, recalling", sizes[-1], _recalling_asks(count)))
        cells.append((f"{sizes[-1]}, asking for a kind", sizes[-1], _kind_asks(count)))
    for i in range(sends + 2):
        timed = i >= 2
        for cell, key, asks in cells:
            session = next(fresh) if key is None else sessions[key]
            first, done = await _sse_send(api, session, ask=next(asks) if asks else None)
            await record(cell, "REST SSE", first, done, timed)
            session = next(fresh) if key is None else sessions[key]
            first, done = await _ws_send(await socket(session), ask=next(asks) if asks else None)
            await record(cell, "WebSocket", first, done, timed)


async def _two_sends(
    send: Callable[[], Awaitable[tuple[float, dict[str, Any]]]],
) -> list[tuple[float, float, dict[str, Any]]]:
    """The first send to an imported session starts its first compaction; the second goes out
    as soon as the first's reply is done, while that compaction commits chunk after chunk. Each
    as (wall time it went out, first delta ms, its `done`)."""
    sent = []
    for _ in range(2):
        wall = time.time()
        first, done = await send()
        sent.append((wall, first, done))
    return sent


_server_envs: dict[int, dict[str, str]] = {}


def server_env(server: ServerProcess) -> dict[str, str]:
    return _server_envs[server.port]


async def _compaction_settled(api: httpx.AsyncClient, session_id: int) -> None:
    """Wait for the background compaction the send started to end, so the next send is timed
    alone: a summary, then the summary and its anchor unchanged for a second (a whole history
    is compacted in chunks, each committed as it goes)."""
    deadline = time.monotonic() + 120
    last: tuple[str, Any] | None = None
    still = 0
    while time.monotonic() < deadline:
        context = (await api.get(f"/api/v1/chat/sessions/{session_id}/context")).json()
        now = (context["context_summary"], context["verbatim_since_message_id"])
        still = still + 1 if now == last and now[0] else 0
        if still >= 5:
            return
        last = now
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the background compaction of session {session_id} did not end in 120 s")


async def _committed_after(api: httpx.AsyncClient, session_id: int, *, wall: float) -> bool:
    """Whether a chunk of the session's compaction was committed after `wall` (a send that
    started then ran while the compaction was still under way)."""
    body = (
        await api.get(
            f"/api/v1/chat/sessions/{session_id}/context", params={"snapshots_limit": 100}
        )
    ).json()
    return any(
        snap["outcome"] == "committed"
        and datetime.fromisoformat(snap["created_at"]).timestamp() > wall
        for snap in body["snapshots"]
    )


def _run_database(*, label: str, url: str, args: Any) -> DbRun:
    run = DbRun(label="SQLite" if label == "sqlite" else "PostgreSQL")
    CACHE.mkdir(exist_ok=True)
    fake = ServerProcess.fake_llm(
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        log_path=CACHE / "ttft-fakellm.log",
        reply_words=REPLY_WORDS,
    )
    try:
        fake.wait_ready(path="/v1/models")
        llm_url = f"{fake.url}/v1"
        env = _env(database_url=url, llm_url=llm_url)
        # Two per round of the cells, two per imported send (each one's warm-up, opened first
        # and not), one per step send.
        fresh = (args.ttft_sends + 2) * 2 + args.ttft_imported_sends * 2 + STEPS_SENDS + 2
        sizes = args.ttft_sizes
        prepared = _worker(
            "prepare", "--sizes", sizes, "--fresh", str(fresh), "--label", label, env=env
        )
        run.version = prepared["server_version"]
        server = ServerProcess.app(env=env, log_path=CACHE / f"ttft-daphne-{label}.log")
        _server_envs[server.port] = env
        try:
            server.wait_ready()
            asyncio.run(
                _measure(run=run, server=server, llm_url=llm_url, prepared=prepared, args=args)
            )
        finally:
            server.stop()
        plan = {
            "token": prepared["token"],
            "sends": 10,
            "sessions": {k: v for k, v in prepared["sessions"].items() if k not in ("imported",)},
        }
        run.inside = _worker("inside", env=env, stdin=json.dumps(plan))
        # Last: its sends add to the largest session, which `inside` measures as the cells
        # left it. A failure here costs this table only.
        try:
            run.steps = _steps(env=env, prepared=prepared, label=label)
        except Exception as exc:
            _log(f"[{label}] step by step failed: {exc}")
    finally:
        fake.stop()
    return run


def _steps(
    *, env: dict[str, str], prepared: dict[str, Any], label: str
) -> dict[str, dict[str, float]]:
    """Where a REST send's time goes, step by step: the same sends again (fresh sessions, and
    the largest summarised one), through the server with a timestamp at each step."""
    sessions = prepared["sessions"]
    sizes = sorted(int(k) for k in sessions if k.isdigit())
    kinds = ["fresh", *([str(sizes[-1])] if sizes else [])]
    log_path = CACHE / f"ttft-steps-{label}.log"
    log_path.write_text("")
    server = ServerProcess.app(
        env={**env, "BENCH_STEPS_LOG": str(log_path)},
        log_path=CACHE / f"ttft-steps-daphne-{label}.log",
        server="daphne-steps",
    )
    fresh = iter(sessions["fresh"][-(STEPS_SENDS + 2) :])

    async def sends() -> list[tuple[str, int, int]]:
        out = []
        headers = {"Authorization": f"Token {prepared['token']}"}
        async with httpx.AsyncClient(base_url=server.url, timeout=120, headers=headers) as api:
            for _ in range(STEPS_SENDS + 2):
                for kind in kinds:
                    session_id = next(fresh) if kind == "fresh" else sessions[kind]
                    sent = time.perf_counter_ns()
                    first, _ = await _sse_send(api, session_id)
                    if not first:
                        raise RuntimeError(f"send to session {session_id}: no delta")
                    out.append((kind, sent, sent + int(first * 1e6)))
        return out

    try:
        server.wait_ready()
        sent = asyncio.run(sends())
    finally:
        server.stop()
    marks = steps_marks(log_path)
    if len(marks) != len(sent):
        raise RuntimeError(f"{len(marks)} sends marked for {len(sent)} sent")
    timed = list(zip(sent, marks, strict=True))[2 * len(kinds) :]
    return {
        kind: steps_medians([(s, r, m) for (k, s, r), m in timed if k == kind]) for kind in kinds
    }


def _ensure_pg_database(url: str) -> str | None:
    from bench.history import _ensure_pg_database as ensure

    return ensure(url)


def run(*, args: Any, command: str) -> str:
    runs: list[DbRun] = []
    for label in [d.strip() for d in str(args.ttft_databases).split(",") if d.strip()]:
        if label == "sqlite":
            url = f"sqlite:///{CACHE / 'ttft.sqlite3'}"
        elif label == "postgres":
            note = _ensure_pg_database(args.ttft_pg_url)
            if note:
                runs.append(DbRun(label="PostgreSQL", note=note))
                continue
            url = args.ttft_pg_url
        else:
            raise SystemExit(f"unknown database {label!r} (sqlite, postgres)")
        started = time.monotonic()
        runs.append(_run_database(label=label, url=url, args=args))
        _log(f"[{label}] done in {time.monotonic() - started:.0f} s")
    return ttft_render(runs=runs, args=args, command=command)
