"""`python -m bench search`: message search latency (GET /api/v1/chat/search and its selector)
on a 1k-message session, a 1M-message session and a user with 100 sessions of 10k messages, on
SQLite and PostgreSQL, against a plain `icontains` scan (issue 15's target: p95 within 2x of the
1k session's).

The app runs for real (Daphne in a subprocess, as `make run` serves it, default settings, token
auth); one keep-alive client sends one request at a time, round-robin over the cells. Then
bench/search_worker.py times the selector and the plain scan in-process on the same data. The
data (bench/search_data.py: seed_demo's English plus planted Chinese and rare identifiers) is
built once per database and kept: .bench/search.sqlite3 and the PostgreSQL database
cadau_bench_search; `--search-reseed` rebuilds it."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.procs import ServerProcess, app_env, worker_run
from bench.report import pct
from bench.search_data import QUERIES, parse_layout

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"
RAW = ROOT / "artifacts" / "bench-search.json"
SEARCH_PATH = "/api/v1/chat/search"
PAGE = 20
# The target: p95 at the large scopes within this factor of the 1k-message session's.
TARGET_RATIO = 2.0
WALKED = ("ident", "zh-rare")  # rare queries: also followed to their last match


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("search")
    group.add_argument(
        "--search-layout",
        default="1000,1000000,100x10000",
        help="users: N = one session of N messages, KxN = K sessions of N; the first is the "
        "baseline",
    )
    group.add_argument("--search-repeats", type=int, default=30, help="timed requests per cell")
    group.add_argument(
        "--search-scan-repeats", type=int, default=10, help="timed plain scans per cell"
    )
    group.add_argument("--search-warmup", type=int, default=3, help="untimed rounds first")
    group.add_argument("--search-databases", default="sqlite,postgres")
    group.add_argument(
        "--search-sqlite", type=Path, default=CACHE / "search.sqlite3", help="bench SQLite file"
    )
    group.add_argument(
        "--search-pg-url",
        default=os.environ.get(
            "BENCH_SEARCH_PG_URL", "postgres://postgres@127.0.0.1:5432/cadau_bench_search"
        ),
    )
    group.add_argument(
        "--search-reseed", action="store_true", help="drop the cached data and build it again"
    )
    group.add_argument(
        "--search-rerender",
        action="store_true",
        help=f"no measuring: render the last run's raw results ({RAW.relative_to(ROOT)})",
    )


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _env(database_url: str) -> dict[str, str]:
    return app_env(database_url, THROTTLE_MESSAGE_SEARCH="off")


def _worker(*args: str, env: dict[str, str], stdin: str | None = None) -> Any:
    return worker_run("bench.search_worker", *args, env=env, stdin=stdin)


def _drop(*, label: str, url: str) -> None:
    if label == "sqlite":
        path = Path(url.removeprefix("sqlite:///"))
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dbname = str(conninfo_to_dict(url)["dbname"])
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))


def cells_for(layout: str, users: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (query, user, scope) cell: all of the user's sessions, and for a one-session user
    other than the early copy, that session alone (`session_id`)."""
    cells = []
    for key, query, _what in QUERIES:
        for spec in parse_layout(layout):
            info = users[spec.label]
            scopes = ["all"]
            if spec.sessions == 1 and not spec.label.endswith("-early"):
                scopes.append("session")
            for scope in scopes:
                cells.append(
                    {
                        "key": f"{key}|{spec.label}|{scope}",
                        "query": query,
                        "user_id": info["user_id"],
                        "token": info["token"],
                        "session_id": info["sessions"][0] if scope == "session" else None,
                        "walk": key in WALKED,
                    }
                )
    return cells


def _measure_http(*, server: ServerProcess, cells: list[dict[str, Any]], args: Any) -> Any:
    timings: dict[str, list[float]] = {c["key"]: [] for c in cells}
    hits: dict[str, int] = {}
    timeouts = dict.fromkeys(timings, 0)
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        for round_no in range(args.search_warmup + args.search_repeats):
            for cell in cells:
                params = {"q": cell["query"], "limit": str(PAGE)}
                if cell["session_id"] is not None:
                    params["session_id"] = str(cell["session_id"])
                headers = {"Authorization": f"Token {cell['token']}"}
                started = time.perf_counter()
                response = client.get(SEARCH_PATH, params=params, headers=headers)
                _ = response.content
                elapsed = (time.perf_counter() - started) * 1000.0
                timed = round_no >= args.search_warmup
                if response.status_code == 503:  # the search's time limit, counted
                    timeouts[cell["key"]] += timed
                elif response.status_code != 200:
                    raise RuntimeError(
                        f"{cell['key']}: HTTP {response.status_code} {response.text[:300]}"
                    )
                else:
                    hits[cell["key"]] = len(response.json()["results"])
                if timed:
                    timings[cell["key"]].append(elapsed)
    return timings, hits, timeouts


def _run_database(*, label: str, url: str, args: Any) -> dict[str, Any]:
    env = _env(url)
    layout = args.search_layout
    state = _worker("status", "--layout", layout, env=env)
    if args.search_reseed or state["state"] == "other":
        _log(f"[{label}] dropping the bench database ({state['state']}) ...")
        _drop(label=label, url=url)
    elif state["state"] == "ready":
        _log(f"[{label}] reusing the data built {state['build'].get('built_at')}")
    prepared = _worker("prepare", "--layout", layout, "--label", label, env=env)
    cells = cells_for(layout, prepared["users"])
    server = ServerProcess.app(env=env, log_path=CACHE / f"search-daphne-{label}.log")
    try:
        server.wait_ready()
        _log(f"[{label}] HTTP: {len(cells)} cells x {args.search_repeats} ...")
        started = time.monotonic()
        http, http_hits, http_timeouts = _measure_http(server=server, cells=cells, args=args)
        _log(f"[{label}]   {time.monotonic() - started:.0f} s")
    finally:
        server.stop()
    plan = {
        "cells": cells,
        "user_ids": [u["user_id"] for u in prepared["users"].values()],
        "warmup": args.search_warmup,
        "repeats": args.search_repeats,
        "scan_repeats": args.search_scan_repeats,
    }
    _log(f"[{label}] in-process: selector and icontains ...")
    started = time.monotonic()
    inside = _worker("inside", env=env, stdin=json.dumps(plan))
    _log(f"[{label}]   {time.monotonic() - started:.0f} s")
    for key, hits in http_hits.items():
        if not inside[key]["timed_out"] and hits != inside[key]["hits"]:
            raise RuntimeError(f"{key}: {hits} hits over HTTP, {inside[key]['hits']} in-process")
    return {
        "label": "SQLite" if label == "sqlite" else "PostgreSQL",
        "version": prepared["server_version"],
        "build": prepared["build"],
        "cells": {
            key: {**inside[key], "http": http[key], "http_timeouts": http_timeouts[key]}
            for key in http
        },
    }


# --- report ------------------------------------------------------------------------------------


def _f(ms: float) -> str:
    return f"{ms:.1f}" if ms < 100 else f"{ms:,.0f}"


def _trio(values: list[float]) -> str:
    return " / ".join(_f(pct(values, q)) for q in (50, 95, 99))


def _who(label: str, layout: str) -> str:
    spec = next(u for u in parse_layout(layout) if u.label == label)
    if label.endswith("-early"):
        return f"{spec.size:,} (oldest ids)"
    if spec.sessions > 1:
        return f"{spec.sessions} x {spec.size:,}"
    return f"{spec.size:,}"


def ratios(cells: dict[str, Any], layout: str) -> list[dict[str, Any]]:
    """Each non-baseline cell's p95 against the baseline user's cell of the same query and
    scope: HTTP, selector and icontains."""
    base = parse_layout(layout)[0].label
    rows = []
    for key, _query, _what in QUERIES:
        for spec in parse_layout(layout)[1:]:
            for scope in ("all", "session"):
                cell = cells.get(f"{key}|{spec.label}|{scope}")
                ref = cells.get(f"{key}|{base}|{scope}")
                if cell is None or ref is None:
                    continue
                got = {
                    kind: pct(cell[kind], 95) / pct(ref[kind], 95)
                    for kind in ("http", "selector", "icontains")
                }
                rows.append({"query": key, "user": spec.label, "scope": scope, **got})
    return rows


def render(
    *, results: list[dict[str, Any]], layout: str, args: Any, command: str, measured: str = ""
) -> str:
    what = {key: (query, text) for key, query, text in QUERIES}
    measured = measured or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = ["## Search: trigram index and window scan against a plain scan", ""]
    lines.append(
        f"Measured {measured} on {os.cpu_count()} "
        f"CPU(s), Python {platform.python_version()}, "
        + ", ".join(r["version"] for r in results if r.get("version"))
        + "."
    )
    lines += [
        "",
        "```sh",
        f"{command}   # this section (`make bench BENCH_ARGS=search`)",
        "python -m bench search --search-databases sqlite   # one database",
        "python -m bench search --search-reseed             # build the data again",
        "python -m bench search --search-rerender           # re-render the last run's results",
        "```",
        "",
        "How: one user per item of the layout `" + layout + "` (N = one session of N "
        "messages, KxN = K sessions of N) and a copy of the first at the oldest ids, built with "
        "seed_demo's generator plus planted Chinese text and rare identifiers "
        "(`bench/search_data.py`), in one database per engine (`.bench/search.sqlite3`, "
        "PostgreSQL `cadau_bench_search`). Ids: the copy first, then the large users in ten "
        "alternating turns (each one's messages in blocks between the other's), the 1k "
        "baseline last. **HTTP** = `GET "
        f"{SEARCH_PATH}?q=...&limit={PAGE}[&session_id=...]` on the app under Daphne as `make "
        "run` serves it (`DEBUG=false`, default settings, token auth, throttle off), one "
        "keep-alive client, one request at a time, client-side wall time. **selector** = "
        "`chat.search.selectors.message_search` (what the view calls) in one process on one "
        "connection. **icontains** = `ChatMessage.objects.filter(session__owner=user, "
        "content__icontains=q).order_by('-id')[:20]` (plus `session_id=` for a session), "
        "timed the same way. "
        f"{args.search_warmup} untimed rounds, then {args.search_repeats} timed requests per "
        f"cell ({args.search_scan_repeats} for icontains), round-robin over the cells. Times in "
        "ms, p50 / p95 / p99. *all* = every session of the user, *session* = `session_id`. "
        "The target is judged on HTTP p95 (what a client waits); the selector's ratio shows "
        "the database's share without the constant per-request cost.",
        "",
        "Queries: "
        + "; ".join(f"`{key}` = {query} ({text})" for key, (query, text) in what.items())
        + ".",
        "",
    ]
    for result in results:
        lines += [f"### {result['label']}", ""]
        if result.get("note"):
            lines += [result["note"], ""]
            continue
        lines += _db_tables(result=result, layout=layout)
    return "\n".join(lines)


def _db_tables(*, result: dict[str, Any], layout: str) -> list[str]:
    cells = result["cells"]
    lines = [
        "| query | messages | scope | HTTP | selector | icontains | SQL per request "
        "| rows read (selector / icontains) | hits on page 1 |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, cell in cells.items():
        query, label, scope = key.split("|")
        http, selector = _trio(cell["http"]), _trio(cell["selector"])
        if cell.get("http_timeouts"):
            http += f" ({cell['http_timeouts']} x 503)"
        if cell.get("selector_timeouts"):
            selector += f" ({cell['selector_timeouts']} timed out)"
        if cell.get("timed_out"):
            rows, found = "-", "timed out"
        else:
            rows = "-" if cell["rows"] is None else f"{cell['rows']:,} / {cell['scan_rows']:,}"
            more = " (+ cursor)" if cell["more"] and cell["hits"] < PAGE else ""
            found = f"{cell['hits']}{more}"
        lines.append(
            f"| {query} | {_who(label, layout)} | {scope} | {http} | {selector} "
            f"| {_trio(cell['icontains'])} | {cell['http_queries']} | {rows} | {found} |"
        )
    lines += [
        "",
        f"p95 against the same query and scope on the {_who(parse_layout(layout)[0].label, layout)}"
        f"-message session (target: HTTP <= {TARGET_RATIO:g}x):",
        "",
        "| query | messages | scope | HTTP | target met | selector | icontains |",
        "| --- | ---: | --- | ---: | --- | ---: | ---: |",
    ]
    for row in ratios(cells, layout):
        met = "yes" if row["http"] <= TARGET_RATIO else "**no**"
        lines.append(
            f"| {row['query']} | {_who(row['user'], layout)} | {row['scope']} "
            f"| {row['http']:.2f}x | {met} | {row['selector']:.2f}x | {row['icontains']:.2f}x |"
        )
    walks = [(key, cell["walk"]) for key, cell in cells.items() if cell.get("walk")]
    if walks:
        lines += [
            "",
            "Rare queries followed page after page (`next_cursor`) to their last match, "
            "selector in-process:",
            "",
            "| query | messages | scope | requests | total ms | matches found |",
            "| --- | ---: | --- | ---: | ---: | ---: |",
        ]
        for key, walk in walks:
            query, label, scope = key.split("|")
            lines.append(
                f"| {query} | {_who(label, layout)} | {scope} | {walk['pages']:,} "
                f"| {_f(walk['ms'])} | {walk['hits']} |"
            )
    build = result["build"]
    parts = [
        f"{_who(label, layout)}: {b['messages']:,} messages seeded in {b['seed_seconds']:.0f} s "
        f"({b['messages'] / max(b['seed_seconds'], 0.1):,.0f} msg/s), {b['planted']:,} planted "
        f"in {b['plant_seconds']:.0f} s"
        for label, b in build["users"].items()
    ]
    lines += [
        "",
        f"Data build ({build['built_at']}, indexes and triggers in place as in production): "
        + "; ".join(parts)
        + f"; statistics {build['analyze_seconds']:.0f} s; **{build['total_seconds'] / 60:.1f} "
        "min in all**.",
        "",
    ]
    return lines


def run(*, args: Any, command: str) -> str:
    if args.search_rerender:
        data = json.loads(RAW.read_text())
        saved = argparse.Namespace(**{**vars(args), **data["args"]})
        return render(
            results=data["results"],
            layout=data["layout"],
            args=saved,
            command=data["command"],
            measured=data.get("measured", ""),
        )
    layout = args.search_layout
    parse_layout(layout)  # a bad layout fails here, before any database is touched
    CACHE.mkdir(exist_ok=True)
    results: list[dict[str, Any]] = []
    for label in [d.strip() for d in str(args.search_databases).split(",") if d.strip()]:
        if label == "sqlite":
            url = f"sqlite:///{Path(args.search_sqlite).resolve()}"
        elif label == "postgres":
            from bench.history import _ensure_pg_database

            note = _ensure_pg_database(args.search_pg_url)
            if note:
                results.append({"label": "PostgreSQL", "note": note})
                continue
            url = args.search_pg_url
        else:
            raise SystemExit(f"unknown database {label!r} (sqlite, postgres)")
        started = time.monotonic()
        results.append(_run_database(label=label, url=url, args=args))
        _log(f"[{label}] done in {time.monotonic() - started:.0f} s")
    RAW.parent.mkdir(exist_ok=True)
    keep = ("search_repeats", "search_scan_repeats", "search_warmup")
    RAW.write_text(
        json.dumps(
            {
                "layout": layout,
                "command": command,
                "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "args": {k: getattr(args, k) for k in keep},
                "results": results,
            }
        )
    )
    return render(results=results, layout=layout, args=args, command=command)
