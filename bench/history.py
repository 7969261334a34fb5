"""`python -m bench history`: latency of one 50-message history page at the newest, middle and
oldest position of 1k / 100k / 1M-message sessions, keyset (the real API) against OFFSET (the
bench-only baseline in bench/offset_app.py), on SQLite and PostgreSQL.

The app runs for real: Daphne in a subprocess on a free loopback port, token login, one
keep-alive httpx client sending requests one at a time. The data comes from seed_demo's code path
and is cached between runs (.bench/history.sqlite3, PostgreSQL database cadau_bench); only
missing sessions are built."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.procs import ServerProcess, app_env, worker_run

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"
HISTORY_PATH = "/api/v1/chat/history"
OFFSET_PATH = "/bench/offset-history"
PAGE = 50
POSITIONS = ("newest", "middle", "oldest")
# The target: a keyset page at 1M messages costs no more than 1.2x the same page at 1k.
TARGET_RATIO = 1.2

Request = tuple[str, str, dict[str, str]]  # (key, path, query params)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("history")
    group.add_argument(
        "--sizes", default="1000,100000,1000000", help="session sizes (messages), comma-separated"
    )
    group.add_argument("--requests", type=int, default=200, help="timed requests per cell")
    group.add_argument("--warmup", type=int, default=20, help="untimed requests per cell first")
    group.add_argument(
        "--databases", default="sqlite,postgres", help="which of sqlite,postgres to run"
    )
    group.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/cadau_bench"),
        help="bench PostgreSQL database (created if missing)",
    )
    group.add_argument(
        "--conn-max-age",
        type=int,
        # Under ASGI, Django runs each request's sync code in a thread of its own, so HTTP
        # requests never reuse a persistent connection anyway: every page here opens one.
        default=0,
        help="DB_CONN_MAX_AGE for the server (0, the default, = a DB connection per request)",
    )
    group.add_argument("--rebuild", action="store_true", help="rebuild the cached sessions")
    group.add_argument(
        "--rerender",
        action="store_true",
        help="no measuring: render the last run's saved timings (.bench/history-last.json)",
    )


@dataclass(kw_only=True)
class DbResult:
    label: str
    note: str = ""
    server_version: str = ""
    sessions: dict[str, Any] = field(default_factory=dict)
    # (endpoint, size, position) -> latencies in ms
    latencies: dict[tuple[str, int, str], list[float]] = field(default_factory=dict)
    queries: dict[tuple[str, int, str], int] = field(default_factory=dict)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _child_env(*, database_url: str, conn_max_age: int) -> dict[str, str]:
    return app_env(
        database_url,
        keep_redis=True,
        CADAU_URLCONF="bench.urls",
        DB_CONN_MAX_AGE=str(conn_max_age),
    )


def _worker(*, args: list[str], env: dict[str, str], stdin: str | None = None) -> Any:
    return worker_run("bench.worker", *args, env=env, stdin=stdin)


def _ensure_pg_database(url: str) -> str | None:
    """Create the bench database if needed; a note instead when PostgreSQL is unreachable."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dbname = str(conninfo_to_dict(url).get("dbname") or "cadau_bench")
    try:
        with psycopg.connect(
            make_conninfo(url, dbname="postgres", connect_timeout=3), autocommit=True
        ) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [dbname]
            ).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    except psycopg.OperationalError as exc:
        return f"skipped: PostgreSQL unreachable ({str(exc).strip().splitlines()[0]})"
    return None


def _get_json(client: httpx.Client, path: str, params: dict[str, str]) -> dict[str, Any]:
    response = client.get(path, params=params)
    if response.status_code != 200:
        raise RuntimeError(
            f"GET {path} {params}: HTTP {response.status_code} {response.text[:300]}"
        )
    data: dict[str, Any] = response.json()
    return data


def _oldest_cursor(*, client: httpx.Client, session: dict[str, Any]) -> str:
    """The cursor a client holds when it scrolls up onto the first page: the older_cursor of the
    second page. Reached from the start (around the first message, then `after`), so the oldest
    page is a full one whatever the API's `around` centring does."""
    sid = str(session["session_id"])
    limit = str(PAGE)
    first = _get_json(
        client,
        HISTORY_PATH,
        {"session_id": sid, "limit": limit, "around": str(session["first_id"])},
    )
    second = _get_json(
        client, HISTORY_PATH, {"session_id": sid, "limit": limit, "after": first["newer_cursor"]}
    )
    cursor = second["older_cursor"]
    oldest = _get_json(client, HISTORY_PATH, {"session_id": sid, "limit": limit, "before": cursor})
    if oldest["messages"][0]["id"] != session["first_id"] or oldest["older_cursor"] is not None:
        raise RuntimeError(f"could not reach the oldest page of session {sid}")
    return str(cursor)


def _plan(*, client: httpx.Client, sizes: list[int], sessions: dict[str, Any]) -> list[Request]:
    requests: list[Request] = []
    for size in sizes:
        s = sessions[str(size)]
        sid = str(s["session_id"])
        keyset = {
            "newest": {"session_id": sid, "limit": str(PAGE)},
            "middle": {"session_id": sid, "limit": str(PAGE), "around": str(s["mid_id"])},
            "oldest": {
                "session_id": sid,
                "limit": str(PAGE),
                "before": _oldest_cursor(client=client, session=s),
            },
        }
        offsets = {"newest": max(size - PAGE, 0), "middle": max(size // 2 - PAGE // 2, 0)}
        offsets["oldest"] = 0
        for position in POSITIONS:
            requests.append((f"keyset|{size}|{position}", HISTORY_PATH, keyset[position]))
            requests.append(
                (
                    f"offset|{size}|{position}",
                    OFFSET_PATH,
                    {"session_id": sid, "limit": str(PAGE), "offset": str(offsets[position])},
                )
            )
    # Sanity: every cell returns a full page of this session (else we would time an error).
    for key, path, params in requests:
        got = _get_json(client, path, params)["messages"]
        if len(got) != min(PAGE, int(key.split("|")[1])):
            raise RuntimeError(f"{key}: expected a full page, got {len(got)} messages")
    return requests


def _measure(*, client: httpx.Client, requests: list[Request], n: int, warmup: int) -> Any:
    """Round-robin over the cells instead of cell after cell: background load on this shared
    2-core machine then hits every cell alike instead of skewing one of them."""
    timings: dict[str, list[float]] = {key: [] for key, _, _ in requests}
    for round_no in range(warmup + n):
        for key, path, params in requests:
            started = time.perf_counter()
            response = client.get(path, params=params)
            _ = response.content
            elapsed = (time.perf_counter() - started) * 1000.0
            if response.status_code != 200:
                raise RuntimeError(f"{key}: HTTP {response.status_code}")
            if round_no >= warmup:
                timings[key].append(elapsed)
    return timings


def _run_database(*, label: str, url: str, sizes: list[int], args: Any) -> DbResult:
    result = DbResult(label=label)
    env = _child_env(database_url=url, conn_max_age=args.conn_max_age)
    worker_args = ["prepare", "--sizes", ",".join(map(str, sizes)), "--label", label]
    worker_args += ["--builds", str(CACHE / "builds.json")]
    if args.rebuild:
        worker_args.append("--rebuild")
    prepared = _worker(args=worker_args, env=env)
    result.sessions = prepared["sessions"]
    result.server_version = prepared["server_version"]

    # The real ASGI app under Daphne, as `make run` serves it, plus the bench URLconf (env).
    server = ServerProcess.app(env=env, log_path=CACHE / f"daphne-{label}.log")
    try:
        server.wait_ready()
        from bench.worker import BENCH_PASSWORD, BENCH_USER

        with httpx.Client(base_url=server.url, timeout=60.0) as client:
            login = client.post(
                "/api/v1/auth/token", json={"username": BENCH_USER, "password": BENCH_PASSWORD}
            )
            if login.status_code != 200:
                raise RuntimeError(f"token login: HTTP {login.status_code} {login.text[:300]}")
            token = login.json()["token"]
            client.headers["Authorization"] = f"Token {token}"
            requests = _plan(client=client, sizes=sizes, sessions=result.sessions)

            plan = json.dumps({"token": token, "requests": requests})
            counts = _worker(args=["count-queries"], env=env, stdin=plan)

            for endpoint in ("keyset", "offset"):
                cells = [r for r in requests if r[0].startswith(endpoint + "|")]
                _log(f"[{label}] timing {endpoint}: {len(cells)} cells x {args.requests} ...")
                started = time.monotonic()
                timings = _measure(
                    client=client, requests=cells, n=args.requests, warmup=args.warmup
                )
                _log(f"[{label}]   {time.monotonic() - started:.0f} s")
                for key, values in timings.items():
                    ep, size, position = key.split("|")
                    result.latencies[(ep, int(size), position)] = values
                    result.queries[(ep, int(size), position)] = counts[key]
    finally:
        server.stop()
    return result


def _pct(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        v = values[0] if values else float("nan")
        return v, v, v
    q = statistics.quantiles(values, n=100, method="inclusive")
    return q[49], q[94], q[98]


def _fmt(ms: float) -> str:
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _render(*, results: list[DbResult], sizes: list[int], args: Any, command: str) -> str:
    lines = _intro_lines(results=results, args=args, command=command)
    for r in results:
        lines.append(f"### {r.label}")
        lines.append("")
        if r.note:
            lines += [r.note, ""]
            continue
        lines += _latency_lines(r=r, sizes=sizes)
        lines += _ratio_lines(r=r, sizes=sizes)
        lines += _build_lines(r=r, sizes=sizes)
    return "\n".join(lines)


def _intro_lines(*, results: list[DbResult], args: Any, command: str) -> list[str]:
    """The heading, what was measured on, how to rerun it and how the figures are taken."""
    lines = ["## History paging: keyset vs OFFSET", ""]
    lines.append(
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on "
        f"{os.cpu_count()} CPU(s), Python {platform.python_version()}, "
        + ", ".join(r.server_version for r in results if r.server_version)
        + "."
    )
    lines += [
        "",
        "```sh",
        f"{command}        # this section (`make bench BENCH_ARGS=history`)",
        "python -m bench history --sizes 1000,100000   # quicker: skip the 1M-message sessions",
        "python -m bench history --databases sqlite    # SQLite only",
        "python -m bench history --rebuild             # rebuild the cached data",
        "```",
        "",
        "How: one session per size (seed_demo's generator, owner `bench`), all sizes in one "
        "database per engine, cached in `.bench/history.sqlite3` and the PostgreSQL database "
        "`cadau_bench`. The real app runs under Daphne on a loopback port "
        f"(`DEBUG=false`, `DB_CONN_MAX_AGE={args.conn_max_age}`, bench URLconf `bench.urls`); one "
        "keep-alive httpx client logs in with a token and sends requests one at a time, "
        f"{args.warmup} untimed then {args.requests} timed per cell, round-robin over the cells. "
        f"Latency is client-side wall time per {PAGE}-message page, in ms.",
        "",
        f"- **keyset** = `GET {HISTORY_PATH}`: newest = no cursor, middle = `around=<id of the "
        "middle message>`, oldest = `before=<cursor>` reached by scrolling up to the start.",
        f"- **OFFSET** = `GET {OFFSET_PATH}` (bench only, `bench/offset_app.py`): "
        "`COUNT(*)` + `ORDER BY id LIMIT 50 OFFSET n`, n = count-50 / count/2 / 0.",
        "- **SQL** = queries per page, counted in-process with `CaptureQueriesContext` "
        "(token authentication included).",
        "",
    ]
    return lines


def _latency_lines(*, r: DbResult, sizes: list[int]) -> list[str]:
    """One engine's table: percentiles and queries per page, keyset beside OFFSET."""
    lines = [
        "| messages | position | keyset p50 | keyset p95 | keyset p99 | keyset SQL "
        "| OFFSET p50 | OFFSET p95 | OFFSET p99 | OFFSET SQL |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size in sizes:
        for position in POSITIONS:
            k = _pct(r.latencies[("keyset", size, position)])
            o = _pct(r.latencies[("offset", size, position)])
            lines.append(
                f"| {size:,} | {position} | {_fmt(k[0])} | {_fmt(k[1])} | {_fmt(k[2])} "
                f"| {r.queries[('keyset', size, position)]} "
                f"| {_fmt(o[0])} | {_fmt(o[1])} | {_fmt(o[2])} "
                f"| {r.queries[('offset', size, position)]} |"
            )
    lines.append("")
    return lines


def _ratio_lines(*, r: DbResult, sizes: list[int]) -> list[str]:
    """p95 at every larger size against the smallest, and whether keyset meets its target."""
    small = min(sizes)
    bigger = [size for size in sizes if size > small]
    if not bigger:
        return []
    # Every size against the smallest, not just the largest: a trap can hit a middle
    # size only (a session whose ids sit below a bigger session's, on PostgreSQL).
    lines = [
        f"p95 at N messages / p95 at {small:,} (target for keyset: <= {TARGET_RATIO}x "
        "at every size):",
        "",
    ]
    head = " | ".join(f"keyset {n:,}" for n in bigger)
    offset_head = " | ".join(f"OFFSET {n:,}" for n in bigger)
    lines.append(f"| position | {head} | target met | {offset_head} |")
    lines.append("| --- |" + " ---: |" * len(bigger) + " --- |" + " ---: |" * len(bigger))
    for position in POSITIONS:
        ratios = {
            (ep, n): _pct(r.latencies[(ep, n, position)])[1]
            / _pct(r.latencies[(ep, small, position)])[1]
            for ep in ("keyset", "offset")
            for n in bigger
        }
        met = all(ratios[("keyset", n)] <= TARGET_RATIO for n in bigger)
        cells = [f"{ratios[('keyset', n)]:.2f}x" for n in bigger]
        cells.append("yes" if met else "**no**")
        cells += [f"{ratios[('offset', n)]:.2f}x" for n in bigger]
        lines.append(f"| {position} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _build_lines(*, r: DbResult, sizes: list[int]) -> list[str]:
    """How fast the cached sessions were built, for those this run built."""
    builds = [
        (size, r.sessions[str(size)].get("build"))
        for size in sizes
        if r.sessions[str(size)].get("build")
    ]
    if not builds:
        return []
    return [
        "Data build (seed_demo code path, batches of 5,000): "
        + "; ".join(
            f"{size:,} messages in {b['seconds']:.1f} s = {b['rate']:,} msg/s ({b['built_at']})"
            for size, b in builds
        )
        + ".",
        "",
    ]


def run(*, args: Any, command: str) -> str:
    if args.rerender:
        return rerender(args=args)
    sizes = sorted({int(s) for s in str(args.sizes).split(",") if s.strip()})
    if not sizes or min(sizes) < 2 * PAGE:
        raise SystemExit(f"--sizes must be at least {2 * PAGE} messages each")
    wanted = [d.strip() for d in str(args.databases).split(",") if d.strip()]
    CACHE.mkdir(exist_ok=True)
    results: list[DbResult] = []
    for label in wanted:
        if label == "sqlite":
            url = f"sqlite:///{CACHE / 'history.sqlite3'}"
        elif label == "postgres":
            note = _ensure_pg_database(args.pg_url)
            if note:
                results.append(DbResult(label="PostgreSQL", note=note))
                continue
            url = args.pg_url
        else:
            raise SystemExit(f"unknown database {label!r} (sqlite, postgres)")
        name = "SQLite" if label == "sqlite" else "PostgreSQL"
        started = time.monotonic()
        result = _run_database(label=label, url=url, sizes=sizes, args=args)
        result.label = name
        _log(f"[{label}] done in {time.monotonic() - started:.0f} s")
        results.append(result)
    _save(results=results, sizes=sizes, args=args, command=command)
    return _render(results=results, sizes=sizes, args=args, command=command)


_LAST = CACHE / "history-last.json"


def _save(*, results: list[DbResult], sizes: list[int], args: Any, command: str) -> None:
    """Raw timings of the last run, so a change to the report needs no new 10-minute run."""
    data = {
        "sizes": sizes,
        "command": command,
        "args": {k: getattr(args, k) for k in ("requests", "warmup", "conn_max_age")},
        "results": [
            {
                "label": r.label,
                "note": r.note,
                "server_version": r.server_version,
                "sessions": r.sessions,
                "latencies": [[*key, values] for key, values in r.latencies.items()],
                "queries": [[*key, n] for key, n in r.queries.items()],
            }
            for r in results
        ],
    }
    _LAST.write_text(json.dumps(data))


def rerender(*, args: Any) -> str:
    data = json.loads(_LAST.read_text())
    results = [
        DbResult(
            label=r["label"],
            note=r["note"],
            server_version=r["server_version"],
            sessions=r["sessions"],
            latencies={(ep, int(n), pos): v for ep, n, pos, v in r["latencies"]},
            queries={(ep, int(n), pos): q for ep, n, pos, q in r["queries"]},
        )
        for r in data["results"]
    ]
    saved = argparse.Namespace(**{**vars(args), **data["args"]})
    return _render(results=results, sizes=data["sizes"], args=saved, command=data["command"])
