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
import json
import os
import platform
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.procs import ServerProcess, app_env, worker_run

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"
# Targets (the issue): Cadau adds at most this much to the model's own time to first token.
TARGET_P50_MS = 10.0
TARGET_P95_MS = 20.0
TARGET_RATIO = 1.2  # the largest session against a fresh one
REPLY_WORDS = 20


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


@dataclass(kw_only=True)
class DbRun:
    label: str
    version: str = ""
    note: str = ""
    # (kind, transport) -> first-delta times, ms; and the model's own for the same payloads
    cells: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    model: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    waited: int = 0  # sends that waited on a summarising call
    sends: int = 0
    inside: dict[str, Any] = field(default_factory=dict)
    # Of the "imported, compacting" sends: how many the compaction was still committing during.
    compacting_overlapped: int = 0
    compacting_sent: int = 0


def _probe(token: str) -> str:
    """A timed send's text: a question in seed_demo's vocabulary (recall, which runs before the
    first token, matches it against many archived turns) with a token of its own that no turn
    holds (its rarest term: looked up in the search index below the recall window)."""
    return f"ttft {token}: why does the retry logic time out with Redis when two workers run?"


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


async def _sse_send(client: httpx.AsyncClient, session_id: int) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    first = 0.0
    done: dict[str, Any] = {}
    body = {"session_id": session_id, "content": _probe(uuid.uuid4().hex[:8])}
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


async def _ws_send(ws: Any) -> tuple[float, dict[str, Any]]:
    client_id = uuid.uuid4().hex
    frame = {"type": "send", "content": _probe(client_id[:8]), "client_id": client_id}
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
    kinds = ["fresh", *[str(s) for s in sorted(int(k) for k in sessions if k.isdigit())]]
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
        for i in range(args.ttft_sends + 2):
            timed = i >= 2  # two untimed rounds: first-call imports, connections, caches
            # Round-robin over the cells: drift on this shared machine hits all of them alike.
            for kind in kinds:
                sse_session = next(fresh) if kind == "fresh" else sessions[kind]
                first, done = await _sse_send(api, sse_session)
                await record(kind, "REST SSE", first, done, timed)
                ws_session = next(fresh) if kind == "fresh" else sessions[kind]
                first, done = await _ws_send(await socket(ws_session))
                await record(kind, "WebSocket", first, done, timed)
        imported = sessions["imported"]
        for i in range(args.ttft_imported_sends):
            # Back to how an import leaves it before every send: each one is a first send.
            _worker("unsummarise", "--session-id", str(imported), env=server_env(server))
            transport = "REST SSE" if i % 2 == 0 else "WebSocket"
            # Untimed, to a fresh session: the server has been idle while the last compaction
            # settled, and a send after idle seconds is slower in every cell (cold caches and
            # threads: a summarised session's send took ~19 ms after 0.5 s idle, ~10 ms in the
            # round-robin). The imported cell measures the session's state, not the idle.
            await _sse_send(api, next(fresh))
            sent: list[tuple[float, float, dict[str, Any]]] = []
            # The first send starts the session's first compaction; the second goes out as soon
            # as the first's reply is done, while that compaction commits chunk after chunk.
            for _ in range(2):
                wall = time.time()
                if transport == "REST SSE":
                    first, done = await _sse_send(api, imported)
                else:
                    first, done = await _ws_send(await socket(imported))
                sent.append((wall, first, done))
            # Its summarising calls go to the same model server: the model's own figures are
            # taken once it ended.
            await _compaction_settled(api, imported)
            await record("imported", transport, sent[0][1], sent[0][2], True)
            run.compacting_sent += 1
            if await _committed_after(api, imported, wall=sent[1][0]):
                run.compacting_overlapped += 1
                await record("imported, compacting", transport, sent[1][1], sent[1][2], True)
    finally:
        for ws in sockets.values():
            await ws.close()
        await api.aclose()
        await model.aclose()


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
        # Two per round of the cells, and one per imported send (its warm-up).
        fresh = (args.ttft_sends + 2) * 2 + args.ttft_imported_sends
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
    finally:
        fake.stop()
    return run


def _pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _f(ms: float) -> str:
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _inside_rows(run: DbRun, kinds: list[str]) -> list[str]:
    lines = [
        "| session | queries before the first token | queries per send | rows read per send "
        "| checks, store and prepare ms | of which prepare ms | model's first chunk ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind in kinds:
        data = run.inside.get(kind)
        if not data:
            continue
        runs = data["runs"]
        spans = data["spans"]

        def med(values: list[Any]) -> str:
            values = [v for v in values if v is not None]
            return _f(statistics.median(values)) if values else "-"

        lines.append(
            f"| {kind} | {med([r['queries_before_first_token'] for r in runs])} "
            f"| {med([r['queries'] for r in runs])} | {med([r['rows_read'] for r in runs])} "
            f"| {med(spans.get('checks, store and prepare', []))} "
            f"| {med(spans.get('prepare: hooks, tail read, payload', []))} "
            f"| {med(data['model_first_chunk_ms'])} |"
        )
    return lines


def _render(*, runs: list[DbRun], args: Any, command: str) -> str:
    lines = _intro_lines(runs=runs, args=args, command=command)
    for run in runs:
        lines += [f"### {run.label}", ""]
        if run.note:
            lines += [run.note, ""]
            continue
        lines += _cell_lines(run)
        sizes = sorted({int(k) for k, _ in run.cells if k.isdigit()})
        if sizes:
            lines += _ratio_lines(run, largest=str(sizes[-1]))
        if run.compacting_sent:
            lines += [
                "",
                f"*imported, compacting*: {run.compacting_overlapped} of {run.compacting_sent} "
                "second sends went out while the first compaction was still committing (a "
                "chunk committed after they started); only those are in the cell.",
            ]
        lines += [
            "",
            f"Sends that waited on a summarising call: **{run.waited} of {run.sends}** "
            "(the `summary_calls_waited` of every reply, imported sessions included).",
            "",
            "Inside the server (the same sends through the real view in one process, 10 per "
            "session, medians; queries counted on every thread's connection):",
            "",
        ]
        kinds = ["fresh", *[str(s) for s in sizes]]
        lines += [*_inside_rows(run, kinds), ""]
    return "\n".join(lines)


def _intro_lines(*, runs: list[DbRun], args: Any, command: str) -> list[str]:
    """The heading, what was measured on, how to rerun it and how the figures are taken."""
    lines = ["## Time to first token: what Cadau adds to the model's", ""]
    lines.append(
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} "
        f"CPU(s), Python {platform.python_version()}, "
        + ", ".join(r.version for r in runs if r.version)
        + "."
    )
    lines += [
        "",
        "```sh",
        f"{command}   # this section (`make bench BENCH_ARGS=ttft`)",
        "python -m bench ttft --ttft-sizes 1000,100000 --ttft-databases sqlite   # quicker",
        "```",
        "",
        "How: the app under Daphne as `make run` serves it (`python -m cadau.serve`, "
        "`DEBUG=false`, default settings: background compaction on, `DB_CONN_MAX_AGE=60`) on a "
        "loopback port, the fake model in its own process (no pacing, "
        f"{REPLY_WORDS}-word replies). One client sends one message at a time and notes the "
        "time from sending to the first `delta`: over REST (`POST /api/v1/chat/send`, "
        "`Accept: text/event-stream`, token auth) and over a WebSocket opened beforehand. "
        "*model*: the same client asking the fake model directly, right after each send, for a "
        "stream of a payload as large as that send's, time to the first token. Sessions: "
        "*fresh* (a new one per send), and seed_demo sessions of N messages with a full "
        "summary (6,000 characters, the default cap) and the last 40 messages verbatim. "
        f"{args.ttft_sends} timed sends per cell after 2 untimed rounds, round-robin over the "
        "cells. *imported*: a 100,000-message session with no summary at all, as seed_demo or "
        "an import leaves it, put back in that state before each of its sends (each is a "
        "first send, right after an untimed send to a fresh session, as the server idled "
        "while the last compaction settled; its *model* figure is taken once the compaction "
        "that send started has ended, as its summarising calls go to the same model server). "
        "*imported, compacting*: a second send to it, as soon as the first one's reply is "
        "done, while the compaction the first started commits chunk after chunk (its *model* "
        "figure also taken once that compaction ended). "
        "*added* = the cell's "
        "percentile minus the model's. All processes share the machine's 2 cores.",
        "",
    ]
    return lines


def _cell_lines(run: DbRun) -> list[str]:
    """One engine's table: every (session, transport) cell against the model's own time."""
    lines = [
        "| session | transport | sends | model p50 / p95 ms | Cadau p50 ms | p95 ms "
        "| p99 ms | added p50 | added p95 | target met |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for (kind, transport), values in run.cells.items():
        model = run.model[(kind, transport)]
        added50 = _pct(values, 50) - _pct(model, 50)
        added95 = _pct(values, 95) - _pct(model, 95)
        met = added50 <= TARGET_P50_MS and added95 <= TARGET_P95_MS
        lines.append(
            f"| {kind} | {transport} | {len(values)} "
            f"| {_f(_pct(model, 50))} / {_f(_pct(model, 95))} | {_f(_pct(values, 50))} "
            f"| {_f(_pct(values, 95))} | {_f(_pct(values, 99))} | {_f(added50)} "
            f"| {_f(added95)} | {'yes' if met else '**no**'} |"
        )
    return lines


def _ratio_lines(run: DbRun, *, largest: str) -> list[str]:
    """The largest session's p50 and p95 against a fresh one's, per transport."""
    lines = ["", f"The {int(largest):,}-message session against a fresh one:", ""]
    for transport in ("REST SSE", "WebSocket"):
        big, fresh = run.cells[(largest, transport)], run.cells[("fresh", transport)]
        r50 = _pct(big, 50) / _pct(fresh, 50)
        r95 = _pct(big, 95) / _pct(fresh, 95)
        met = r50 <= TARGET_RATIO and r95 <= TARGET_RATIO
        lines.append(
            f"- {transport}: p50 {r50:.2f}x, p95 {r95:.2f}x "
            f"(target <= {TARGET_RATIO}x: {'met' if met else '**not met**'})"
        )
    return lines


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
    return _render(runs=runs, args=args, command=command)
