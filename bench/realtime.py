"""`python -m bench realtime`: the latency the app adds to every streamed token, through the
WebSocket, under Daphne (as `make run` serves it: cadau/serve.py, on uvloop), plain Daphne
(asyncio's loop) and, for comparison, uvicorn.

Setup: the fake OpenAI-compatible server runs as its own process (`manage.py fakellm
--token-ms 20 --reply-words N`) and stamps every chunk with its emit time (`x_emit_ts`,
time.time()); the app passes that stamp on as `emitted_at` in each `delta` event. The client
(this process, asyncio + websockets) notes time.time() the moment a frame arrives, before
parsing it. Added latency per token = receive time - emit time: the app's HTTP read of the
upstream stream, the channel-layer fan-out, the consumer, the WebSocket write and the client's
read. Same machine, same clock; the client and the fake server share the 2 cores with the
server under test, so the figures include their contention.

Runs: 1 client (several turns back to back), then N concurrent sockets (default 200), each on
its own session, all sending at once, repeated (--rt-repeats). RSS of the server process is
sampled every 100 ms."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

from bench.procs import ServerProcess, app_env, free_port, listening_sockets

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"

TARGET_P99_1_MS = 5.0
# What the figures mean and what was done about them; kept with the code that measures them.
ANALYSIS: list[str] = [
    "Where the time goes: 200 replies at one token per 20 ms are 10,000 upstream SSE chunks "
    "and up to 10,000 WebSocket frames a second, plus 200 sends' database work arriving at "
    "once and 200 final writes a few seconds later. All of it is Python, on one event loop "
    "per server process, on 2 cores that also run the client, the fake model, PostgreSQL and "
    "Redis. The 1-client rows show the cost of a token itself is well under a millisecond; "
    "under load the latency is queueing. The ramp-up and ramp-down columns show where: while "
    "all 200 stream and no database work is in flight, the p95 stays at a few milliseconds; "
    "the slow tokens sit in the ramp-up (200 sends' ORM work) and the ramp-down (200 final "
    "writes), where worker threads running ORM code hold the GIL the event loop needs for "
    "every token. A thread that gives the GIL up for a system call waits up to the 5 ms "
    "switch interval to get it back while another thread computes, and the loop makes many "
    "such calls per iteration.",
    "",
    "The figures depend on the machine more than on anything else. The same code (e9357b6) "
    "measured a whole-run p95 of 68.5 ms (median of five runs, 55.0-83.5) on the machine of "
    "2026-12-02, whose speed moved by up to 50% from one minute to the next (CPU shared with "
    "other tenants), and 4.5 ms (2.8-23.3) on the steadier machine of 2026-12-03; the "
    "all-streaming window went from 30.5 to 0.9 ms. Hence several runs per server, taken in "
    "turns, and the median; and hence the work on the ramps below, which is what a slower or "
    "busier machine sees first.",
    "",
    "Fixes found with this benchmark and py-spy, in order (p95, 200 sockets, one process "
    "unless said): forwarded events skip Channels' per-message `close_old_connections` hop "
    "and the in-memory layer sweeps expiry once a second (28.6 s -> ~12 s); deltas coalesce "
    "when the loop falls behind (-> ~1.0 s); progress saves of all live replies are one "
    "transaction every 0.5 s (-> ~0.4 s). Then: the upstream stream is read by aiohttp under "
    "httpx's API (~140 -> ~70 us of CPU per chunk; chat/llm/transport.py); events reach this "
    "process's sockets straight into their outbox instead of through the channel layer, and "
    "deltas cross Redis only while another process watches the session "
    "(chat/events.py); a send's database work takes 4 trips instead of 10, on "
    "persistent connections, in the thread pool rather than queued behind one thread; frames "
    "are encoded with orjson; the fake model writes all streams from one pacer thread "
    "instead of 200 sleeping ones (~45% of a core before). Next: a send reuses the rows it "
    "stored and a finish writes the held row once (21 -> 14 queries per reply, ~9.6 -> ~6 ms "
    "of ORM CPU on SQLite); tokens go from the stream reader straight into the sockets' "
    "outboxes and a socket sends its whole backlog as one merged delta; SSE lines are split "
    "from the raw bytes and parsed with orjson; frames go to the server's own ASGI send; and "
    "Daphne's reactor runs on uvloop (`python -m cadau.serve`): with all 200 streaming, "
    "half-second buckets stayed at a p95 of 5-40 ms where asyncio's loop saturated at 60-130 "
    "ms (2026-12-02 machine). Last: a completed reply's `done` budget is worked out from the "
    "context its payload was built from, when the final write's guard shows that nothing "
    "moved it (no read-back: 14 -> 12 queries per reply, ~1.3 -> ~0.4 ms of CPU per "
    "finish); in alternated runs, eight each, the ramp-down p95 went from a median of ~130 "
    "ms (35-182) to ~52 ms (31-71), and the whole-run p95 from 6.7 to 2.6 ms.",
    "",
    "Tried and measured, not adopted: a 0.5-1 ms switch interval; one worker thread for all "
    "of a turn's database work; and at most one (or two) sends' database work at a time "
    "(a semaphore, eight and six alternated runs): the loop then contends with one thread "
    "instead of six, so p99 fell from ~35 to ~10 ms (two: ~17 ms), but the burst's last "
    "reply started 1.7 s after its send instead of 1.0 s and the whole-run p95 rose from "
    "3.4 to 7.6 ms (two: 12.1 ms).",
]
TARGET_P95_N_MS = 50.0

Kind = Literal["daphne", "daphne-asyncio", "uvicorn"]
# The --rt-servers names: how each is started is in bench/procs.py, ServerProcess.app.
KINDS: tuple[Kind, ...] = get_args(Kind)

_SETUP = """
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
django.setup()
from django.contrib.auth import get_user_model
from django.test import Client
from chat.models import ChatSession
n = int(sys.argv[1])
user, _ = get_user_model().objects.get_or_create(username="bench-rt")
client = Client()
client.force_login(user)
ids = [ChatSession.objects.create(owner=user, title=f"rt {i}").pk for i in range(n)]
print(json.dumps({"cookie": client.cookies["sessionid"].value, "sessions": ids}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("realtime")
    group.add_argument("--rt-clients", type=int, default=200, help="concurrent sockets")
    group.add_argument("--rt-turns", type=int, default=5, help="turns of the 1-client run")
    group.add_argument(
        "--rt-words",
        type=int,
        default=250,
        help="tokens (words) per reply (250 at 20 ms: 5 s, so every socket streams at once)",
    )
    group.add_argument("--rt-token-ms", type=float, default=20.0, help="fake LLM token pacing")
    group.add_argument(
        "--rt-servers",
        default="daphne,daphne-asyncio,uvicorn",
        help="which to run: daphne (as `make run`: Daphne on uvloop), daphne-asyncio (plain "
        "`python -m daphne`), uvicorn",
    )
    group.add_argument(
        "--rt-repeats",
        type=int,
        default=5,
        help="runs of the N-client load per server (the machine's speed varies run to run)",
    )
    group.add_argument(
        "--rt-processes",
        default="1,2",
        help="Daphne process counts to run; more than 1 share one socket, PostgreSQL and Redis",
    )
    group.add_argument(
        "--rt-pg-url",
        default=os.environ.get(
            "BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/cadau_bench_rt"
        ).rsplit("/", 1)[0]
        + "/cadau_bench_rt",
        help="PostgreSQL for the multi-process rows (created if missing)",
    )
    group.add_argument(
        "--rt-redis-url",
        default="redis://127.0.0.1:6379/14",
        help="Redis (the channel layer) for the multi-process rows",
    )
    group.add_argument(
        "--rt-database-url",
        default="",
        help="DATABASE_URL for the server (default: a fresh SQLite file in .bench/)",
    )


@dataclass(kw_only=True)
class RunResult:
    clients: int
    expected: int = 0
    connected: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    # Per delta: receive time (time.time()), for the "all streaming" window.
    received_at: list[float] = field(default_factory=list)
    # Per reply: (first delta received, done received), time.time(); for the concurrency figures.
    streams: list[tuple[float, float]] = field(default_factory=list)
    # Per reply: send -> first delta received, ms (includes the fake model's first token).
    first_delta_ms: list[float] = field(default_factory=list)
    replies: int = 0
    failed: int = 0
    wall_s: float = 0.0
    rss_idle_mb: float = 0.0
    rss_peak_mb: float = 0.0


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pct(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[k]


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _RssSampler:
    """Peak of the summed RSS of the server processes."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(_rss_mb(pid) for pid in self.pids))
            self._stop.wait(0.1)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _env(*, database_url: str, llm_url: str) -> dict[str, str]:
    return app_env(
        database_url,
        LLM_BASE_URL=llm_url,
        LLM_API_KEY="bench",
        LLM_MODEL="fake-chat",
        # Measure streaming, not summarising: the bench sessions stay far below any threshold.
        CHAT_BACKGROUND_COMPACTION="false",
    )


def _manage(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, input=stdin, text=True, capture_output=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{args[:1]!r}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return proc.stdout


async def _turns(
    *, port: int, session_id: int, cookie: str, turns: int, start: asyncio.Event, out: RunResult
) -> None:
    import websockets

    url = f"ws://127.0.0.1:{port}/ws/chat/{session_id}/"
    headers = {"Cookie": f"sessionid={cookie}", "Origin": f"http://127.0.0.1:{port}"}
    async with websockets.connect(url, additional_headers=headers, open_timeout=60) as ws:
        out.connected += 1
        await start.wait()
        for turn in range(turns):
            frame = {"type": "send", "content": f"bench turn {turn}", "client_id": uuid.uuid4().hex}
            sent = time.time()
            first = 0.0
            await ws.send(json.dumps(frame))
            while True:
                raw = await asyncio.wait_for(ws.recv(), timeout=120)
                received = time.time()  # before parsing: parsing is the client's, not the app's
                event = json.loads(raw)
                if event["type"] == "delta" and "emitted_at" in event:
                    out.latencies_ms.append((received - event["emitted_at"]) * 1000.0)
                    out.received_at.append(received)
                    if not first:
                        first = received
                        out.first_delta_ms.append((first - sent) * 1000.0)
                elif event["type"] == "done":
                    if first:
                        out.streams.append((first, received))
                    out.replies += 1
                    if event["message"]["status"] != "complete":
                        out.failed += 1
                    break
                elif event["type"] == "error":
                    out.failed += 1


async def _run_clients(
    *, port: int, pids: list[int], sessions: list[int], cookie: str, turns: int
) -> RunResult:
    result = RunResult(clients=len(sessions), expected=len(sessions) * turns)
    start = asyncio.Event()
    tasks = [
        asyncio.ensure_future(
            _turns(port=port, session_id=s, cookie=cookie, turns=turns, start=start, out=result)
        )
        for s in sessions
    ]
    # All sockets open before anyone sends: the idle RSS is "N sockets connected".
    deadline = time.monotonic() + 120
    while result.connected < len(sessions) and time.monotonic() < deadline:
        if any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    result.rss_idle_mb = sum(_rss_mb(pid) for pid in pids)
    with _RssSampler(pids) as sampler:
        started = time.monotonic()
        start.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        result.wall_s = time.monotonic() - started
    result.rss_peak_mb = sampler.peak
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        _log(f"  {len(errors)} client(s) failed, first: {errors[0]!r}")
        result.failed += len(errors)
    return result


def _phases(result: RunResult) -> tuple[list[float], list[float], list[float]]:
    """Latencies of the deltas received before every reply had started (ramp-up: the sends'
    database work still running), while every socket was streaming (after the last reply
    started and before the first one ended, so no send, no final write is in the way), and
    after the first one ended (ramp-down: the final writes running)."""
    if not result.streams or len(result.streams) < result.clients:
        return [], [], []
    start = max(first for first, _ in result.streams)
    end = min(done for _, done in result.streams)
    phases: tuple[list[float], list[float], list[float]] = ([], [], [])
    for at, lat in zip(result.received_at, result.latencies_ms, strict=True):
        phases[0 if at < start else 2 if at > end else 1].append(lat)
    return phases


def _all_streaming(result: RunResult) -> list[float]:
    return _phases(result)[1]


def _peak_streams(streams: list[tuple[float, float]]) -> tuple[int, float]:
    """Most replies streaming at the same moment, and for how long (s) that many did."""
    edges = sorted([(a, 1) for a, _ in streams] + [(b, -1) for _, b in streams])
    peak, held, now, since = 0, 0.0, 0, 0.0
    for at, step in edges:
        if now == peak and now:
            held += at - since
        now += step
        if now > peak:
            peak, held = now, 0.0
        since = at
    return peak, held


def _client_run(coro: Any) -> RunResult:
    """Run the load generator on uvloop when it is there: the client shares the machine with
    the server under test, so the less CPU it takes per frame the less it skews the figures."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "?"


@dataclass(kw_only=True)
class Setup:
    """One way of serving the app: a row group of the table."""

    label: str
    kind: Kind
    processes: int
    env: dict[str, str]


def _multi_env(*, args: argparse.Namespace, llm_url: str) -> tuple[dict[str, str] | None, str]:
    """Environment for N processes (PostgreSQL + Redis, as README "Running N processes"), or
    None and why not."""
    import redis

    from bench.history import _ensure_pg_database

    note = _ensure_pg_database(args.rt_pg_url)
    if note:
        return None, note
    try:
        redis.Redis.from_url(args.rt_redis_url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        return None, f"skipped: Redis unreachable ({exc})"
    env = _env(database_url=args.rt_pg_url, llm_url=llm_url)
    env["REDIS_URL"] = args.rt_redis_url
    return env, ""


def run(*, args: argparse.Namespace, command: str) -> str:
    servers = [s.strip() for s in args.rt_servers.split(",") if s.strip()]
    unknown = set(servers) - set(KINDS)
    if unknown:
        raise SystemExit(f"--rt-servers: unknown {', '.join(sorted(unknown))}")
    counts = sorted({int(n) for n in args.rt_processes.split(",") if n.strip()})
    if not counts or counts[0] < 1:
        raise SystemExit("--rt-processes: positive integers, e.g. 1,2")
    CACHE.mkdir(exist_ok=True)
    if args.rt_database_url:
        database_url, db_label = args.rt_database_url, "PostgreSQL (--rt-database-url)"
    else:
        db_file = CACHE / "realtime.sqlite3"
        for suffix in ("", "-wal", "-shm"):
            Path(str(db_file) + suffix).unlink(missing_ok=True)
        database_url, db_label = f"sqlite:///{db_file}", "SQLite (fresh file, WAL)"
    llm_port = free_port()
    llm_url = f"http://127.0.0.1:{llm_port}/v1"
    env = _env(database_url=database_url, llm_url=llm_url)
    setups: list[Setup] = []
    notes: list[str] = []
    for name in servers:
        kind = cast(Kind, name)  # checked against KINDS above
        for n in counts if kind == "daphne" else [1]:
            if n == 1:
                setups.append(Setup(label=kind, kind=kind, processes=1, env=env))
                continue
            multi, why = _multi_env(args=args, llm_url=llm_url)
            if multi is None:
                notes.append(f"{kind} x {n}: {why}")
                continue
            setups.append(Setup(label=f"{kind} x {n} (Redis)", kind=kind, processes=n, env=multi))
    migrated: set[str] = set()
    for setup in setups:
        if setup.env["DATABASE_URL"] not in migrated:
            _log(f"realtime: migrate {setup.env['DATABASE_URL']}")
            _manage(setup.env, "manage.py", "migrate", "--noinput", "-v", "0")
            migrated.add(setup.env["DATABASE_URL"])
    fake = ServerProcess.fake_llm(
        env=env,
        log_path=CACHE / "realtime-fakellm.log",
        token_ms=args.rt_token_ms,
        reply_words=args.rt_words,
        port=llm_port,
    )
    rows: dict[str, tuple[RunResult, list[RunResult]]] = {}
    load_before = os.getloadavg()
    started: list[_Started] = []
    try:
        fake.wait_ready(path="/v1/models")
        # Every server up at once (idle ones cost nothing), then the N-client runs taken in
        # turns, forward and back: the machine's speed drifts over minutes, and one server's
        # runs all in one stretch would compare stretches, not servers.
        for setup in setups:
            started.append(_start(args=args, setup=setup))
        ones: dict[str, RunResult] = {}
        many: dict[str, list[RunResult]] = {setup.label: [] for setup in setups}
        for one in started:
            _log(f"realtime: {one.setup.label}, 1 client x {args.rt_turns} turns")
            ones[one.setup.label] = _client_run(
                _run_clients(
                    port=one.port,
                    pids=one.pids,
                    sessions=one.sessions[:1],
                    cookie=one.cookie,
                    turns=args.rt_turns,
                )
            )
        for run in range(max(1, args.rt_repeats)):
            for one in started if run % 2 == 0 else started[::-1]:
                _log(f"realtime: {one.setup.label}, {args.rt_clients} clients, run {run + 1}")
                many[one.setup.label].append(
                    _client_run(
                        _run_clients(
                            port=one.port,
                            pids=one.pids,
                            sessions=one.sessions[1:],
                            cookie=one.cookie,
                            turns=1,
                        )
                    )
                )
        rows = {setup.label: (ones[setup.label], many[setup.label]) for setup in setups}
    finally:
        for one in started:
            one.stop()
        fake.stop()
    load = (load_before[0], os.getloadavg()[0])
    return _report(args=args, command=command, rows=rows, db_label=db_label, load=load, notes=notes)


@dataclass(kw_only=True)
class _Started:
    """One setup's servers, running, and the sessions its clients use."""

    setup: Setup
    servers: list[ServerProcess]
    listeners: list[socket.socket]
    sessions: list[int]
    cookie: str

    @property
    def port(self) -> int:
        return self.servers[0].port

    @property
    def pids(self) -> list[int]:
        return [server.proc.pid for server in self.servers]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        for listener in self.listeners:
            listener.close()


def _start(*, args: argparse.Namespace, setup: Setup) -> _Started:
    ids = json.loads(
        _manage(setup.env, "-c", _SETUP, str(args.rt_clients + 1)).strip().splitlines()[-1]
    )
    slug = setup.kind if setup.processes == 1 else f"{setup.kind}-x{setup.processes}"
    started = _Started(
        setup=setup, servers=[], listeners=[], sessions=ids["sessions"], cookie=ids["cookie"]
    )
    try:
        if setup.processes == 1:
            started.servers.append(
                ServerProcess.app(
                    env=setup.env, log_path=CACHE / f"realtime-{slug}.log", server=setup.kind
                )
            )
        else:
            # One port, a socket per process (SO_REUSEPORT: the kernel spreads the clients).
            started.listeners = listening_sockets(setup.processes)
            for i, listener in enumerate(started.listeners):
                started.servers.append(
                    ServerProcess.daphne_on_socket(
                        env=setup.env,
                        log_path=CACHE / f"realtime-{slug}-{i}.log",
                        listener=listener,
                    )
                )
        for server in started.servers:
            server.wait_ready()
    except BaseException:
        started.stop()
        raise
    return started


def _verdict(values: list[float]) -> str:
    """Median of the runs' p95 (range), and whether the median meets the target."""
    median = _pct(values, 50)
    spread = f"{_ms(min(values))}-{_ms(max(values))}" if len(values) > 1 else ""
    verdict = "met" if median <= TARGET_P95_N_MS else "missed"
    return f"**{_ms(median)} ms**" + (f" ({spread})" if spread else "") + f", {verdict}"


def _ms(value: float) -> str:
    return f"{value:.1f}" if value == value else "n/a"


def _report(
    *,
    args: argparse.Namespace,
    command: str,
    rows: dict[str, tuple[RunResult, list[RunResult]]],
    db_label: str,
    load: tuple[float, float],
    notes: list[str],
) -> str:
    n = args.rt_clients
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "## Realtime: added latency per streamed token (WebSocket)",
        "",
        f"Measured {when} on {os.cpu_count()} CPU(s), Python {platform.python_version()}, "
        f"Daphne {_version('daphne')}, uvicorn {_version('uvicorn')}, Channels "
        f"{_version('channels')}, uvloop {_version('uvloop')}. *daphne*: `python -m "
        "cadau.serve`, as `make run` serves (Daphne, its Twisted reactor on a uvloop event "
        "loop); *daphne-asyncio*: plain `python -m daphne` (asyncio's own loop); *uvicorn*: "
        "`uvicorn` with uvloop and websockets, for comparison. One process: in-memory channel "
        f"layer, database {db_label}. N processes (`x N`): N Daphne processes on one port, each "
        "on its own SO_REUSEPORT socket (`--fd`), PostgreSQL and Redis (channels-redis "
        f"{_version('channels-redis')}).",
        "",
        "```sh",
        *([command] if command.strip() != "python -m bench realtime" else []),
        "python -m bench realtime   # this section (`make bench BENCH_ARGS=realtime`)",
        "python -m bench realtime --rt-clients 50 --rt-servers daphne   # quicker",
        "```",
        "",
        f"How: the fake LLM server runs as its own process and streams one token every "
        f"{args.rt_token_ms:g} ms ({args.rt_words} tokens per reply), stamping each chunk with "
        "its emit time (`x_emit_ts`, passed on by the app as `emitted_at` in `delta` events). "
        "The client (asyncio on uvloop + `websockets`, one process) notes `time.time()` when a "
        "frame arrives, before parsing it; **added latency = receive time - emit time** (same "
        "clock). It covers the app reading the upstream stream, the fan-out, the consumer and "
        "the WebSocket write. 1 client: "
        f"{args.rt_turns} turns back to back on one socket. {n} clients: {n} sockets, each on "
        "its own session, all connected first, then all send at once (one turn each); every "
        "delta of every reply counts, the burst of sends and final writes included; "
        f"{args.rt_repeats} such runs per server, the servers taking turns (all run side by "
        "side, idle but for the one under load), because the machine's speed drifts from "
        "minute to minute and one run is not a figure. "
        "*All streaming*: only the deltas received while every socket was streaming (after the "
        "last reply started, before the first ended); *ramp-up* and *ramp-down*: the deltas "
        "before and after that window, while the sends' and the final writes' database work "
        "runs. *First delta*: send to first delta, as "
        "the client sees it. RSS: the server processes summed, idle with all sockets open and "
        "peak while streaming (sampled every 100 ms). The client, the fake server, PostgreSQL "
        "and Redis run on the same 2 cores as the server, so their CPU is part of the figures. "
        f"1-minute load average before / after the run: {load[0]:.2f} / {load[1]:.2f} (other "
        "work on the machine shows here).",
        "",
        "| server | clients | run | tokens | p50 ms | p95 ms | p99 ms | max ms | all "
        "streaming: tokens, p95 ms | ramp-up, ramp-down: tokens, p95 ms | replies ok | "
        "streaming at once (for s) | first delta p95 ms | wall s | RSS idle MB | RSS peak MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        "---: | ---: | ---: | ---: |",
    ]
    for label, (one, many) in rows.items():
        runs = [(one, "-")] + [(r, f"{i + 1}/{len(many)}") for i, r in enumerate(many)]
        for result, run in runs:
            lat = result.latencies_ms
            peak, held = _peak_streams(result.streams)
            steady = _all_streaming(result) if result.clients > 1 else []
            steady_cell = f"{len(steady):,}, {_ms(_pct(steady, 95))}" if steady else "-"
            up, _, down = _phases(result) if result.clients > 1 else ([], [], [])
            ends_cell = (
                f"{len(up):,}, {_ms(_pct(up, 95))}; {len(down):,}, {_ms(_pct(down, 95))}"
                if up or down
                else "-"
            )
            lines.append(
                f"| {label} | {result.clients} | {run} | {len(lat):,} | {_ms(_pct(lat, 50))} | "
                f"{_ms(_pct(lat, 95))} | {_ms(_pct(lat, 99))} | "
                f"{_ms(max(lat) if lat else float('nan'))} | {steady_cell} | {ends_cell} | "
                f"{result.replies - result.failed}/{result.expected} | "
                f"{peak} ({held:.1f}) | {_ms(_pct(result.first_delta_ms, 95))} | "
                f"{result.wall_s:.1f} | {result.rss_idle_mb:.0f} | {result.rss_peak_mb:.0f} |"
            )
    lines += [f"- {note}" for note in notes]
    lines += [
        "",
        f"Targets (Daphne; for {n} clients the median of the runs, their range in brackets):",
    ]
    for label, (one, many) in rows.items():
        if not label.startswith("daphne"):
            continue
        p99 = _pct(one.latencies_ms, 99)
        whole = [_pct(r.latencies_ms, 95) for r in many]
        steady = [_pct(_all_streaming(r), 95) for r in many]
        lines.append(
            f"- {label}: 1 client p99 <= {TARGET_P99_1_MS:g} ms: **{_ms(p99)} ms**, "
            f"{'met' if p99 <= TARGET_P99_1_MS else 'missed'}; {n} clients p95 <= "
            f"{TARGET_P95_N_MS:g} ms: {_verdict(whole)} over the whole run; "
            f"{_verdict(steady)} while all {n} were streaming."
        )
    lines += ["", *ANALYSIS]
    return "\n".join(lines)
