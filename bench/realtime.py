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
import os
from pathlib import Path

from bench.procs import ServerProcess, free_port
from bench.realtime_client import RunResult, client_run, log, run_clients
from bench.realtime_report import report
from bench.realtime_servers import (
    CACHE,
    KINDS,
    Setup,
    Started,
    server_env,
    setup_start,
    setups_migrate,
    setups_plan,
)


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


def run(*, args: argparse.Namespace, command: str) -> str:
    servers, counts = _servers_and_counts(args)
    CACHE.mkdir(exist_ok=True)
    database_url, db_label = _database(args)
    llm_port = free_port()
    llm_url = f"http://127.0.0.1:{llm_port}/v1"
    env = server_env(database_url=database_url, llm_url=llm_url)
    setups, notes = setups_plan(args=args, servers=servers, counts=counts, env=env, llm_url=llm_url)
    setups_migrate(setups)
    fake = ServerProcess.fake_llm(
        env=env,
        log_path=CACHE / "realtime-fakellm.log",
        token_ms=args.rt_token_ms,
        reply_words=args.rt_words,
        port=llm_port,
    )
    load_before = os.getloadavg()
    started: list[Started] = []
    try:
        fake.wait_ready(path="/v1/models")
        # Every server up at once (idle ones cost nothing), then the N-client runs taken in
        # turns, forward and back: the machine's speed drifts over minutes, and one server's
        # runs all in one stretch would compare stretches, not servers.
        for setup in setups:
            started.append(setup_start(args=args, setup=setup))
        rows = _measure(args=args, setups=setups, started=started)
    finally:
        for one in started:
            one.stop()
        fake.stop()
    load = (load_before[0], os.getloadavg()[0])
    return report(args=args, command=command, rows=rows, db_label=db_label, load=load, notes=notes)


def _servers_and_counts(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    """--rt-servers and --rt-processes, checked."""
    servers = [s.strip() for s in args.rt_servers.split(",") if s.strip()]
    unknown = set(servers) - set(KINDS)
    if unknown:
        raise SystemExit(f"--rt-servers: unknown {', '.join(sorted(unknown))}")
    counts = sorted({int(n) for n in args.rt_processes.split(",") if n.strip()})
    if not counts or counts[0] < 1:
        raise SystemExit("--rt-processes: positive integers, e.g. 1,2")
    return servers, counts


def _database(args: argparse.Namespace) -> tuple[str, str]:
    """DATABASE_URL of the one-process setups and its label: --rt-database-url, or a fresh
    SQLite file (the previous run's file and its WAL removed)."""
    if args.rt_database_url:
        return args.rt_database_url, "PostgreSQL (--rt-database-url)"
    db_file = CACHE / "realtime.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(str(db_file) + suffix).unlink(missing_ok=True)
    return f"sqlite:///{db_file}", "SQLite (fresh file, WAL)"


def _measure(
    *, args: argparse.Namespace, setups: list[Setup], started: list[Started]
) -> dict[str, tuple[RunResult, list[RunResult]]]:
    """Each running setup's 1-client run, then --rt-repeats rounds of its N-client run, the
    setups taking turns (alternate rounds in reverse order)."""
    ones: dict[str, RunResult] = {}
    many: dict[str, list[RunResult]] = {setup.label: [] for setup in setups}
    for one in started:
        log(f"realtime: {one.setup.label}, 1 client x {args.rt_turns} turns")
        ones[one.setup.label] = _load(one=one, sessions=one.sessions[:1], turns=args.rt_turns)
    for round_ in range(max(1, args.rt_repeats)):
        for one in started if round_ % 2 == 0 else started[::-1]:
            log(f"realtime: {one.setup.label}, {args.rt_clients} clients, run {round_ + 1}")
            many[one.setup.label].append(_load(one=one, sessions=one.sessions[1:], turns=1))
    return {setup.label: (ones[setup.label], many[setup.label]) for setup in setups}


def _load(*, one: Started, sessions: list[int], turns: int) -> RunResult:
    return client_run(
        run_clients(port=one.port, pids=one.pids, sessions=sessions, cookie=one.cookie, turns=turns)
    )
