"""The Django half of the search benchmark (bench/search.py), run as a subprocess with the
DATABASE_URL of one bench database:

    python -m bench.search_worker status --layout 1000,1000000,100x10000
    python -m bench.search_worker prepare --layout 1000,1000000,100x10000 --label sqlite
    python -m bench.search_worker inside < plan.json
    python -m bench.search_worker explain --user 1000000 --q refactor [--session]

Each prints one JSON document on stdout (explain: plain text); progress goes to stderr."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import django

from bench.dbstats import statistics_refreshed
from bench.search_data import (
    RECIPE_VERSION,
    UserLayout,
    parse_layout,
    planted_content,
    rare_positions,
    seeding_plan,
)

MARKER_USER = "search-bench-marker"
PAGE = 20
PLANT_BATCH = 2000
WALK_MAX_PAGES = 2000


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    django.setup()


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _marker_title(layout: str) -> str:
    return f"search-bench data v{RECIPE_VERSION} {layout}"


def status(*, layout: str) -> dict[str, Any]:
    """`ready` (the marker of this recipe and layout: written last, so the data is complete),
    `empty` (no message at all) or `other` (anything else: an interrupted build, another
    layout or recipe; the parent drops the database). Migrates only a database it keeps: a
    migration over millions of rows about to be dropped would take minutes for nothing."""
    from django.core.management import call_command
    from django.db import DatabaseError, connection

    with connection.cursor() as cursor:
        try:
            cursor.execute(
                "SELECT s.title, s.context_summary FROM chat_sessions s "
                "JOIN auth_user u ON u.id = s.owner_id WHERE u.username = %s",
                [MARKER_USER],
            )
            marker = cursor.fetchone()
            cursor.execute("SELECT EXISTS (SELECT 1 FROM chat_messages)")
            (any_message,) = cursor.fetchone()
        except DatabaseError:  # a new database: no tables yet
            marker, any_message = None, False
    if marker is not None and marker[0] == _marker_title(layout):
        call_command("migrate", verbosity=0, interactive=False)
        return {"state": "ready", "build": json.loads(marker[1])}
    if marker is None and not any_message:
        call_command("migrate", verbosity=0, interactive=False)
        return {"state": "empty"}
    return {"state": "other"}


def _plant(*, user: Any, layout: UserLayout) -> int:
    """Overwrite the recipe's positions of the user's messages (bench/search_data.py)."""
    from django.db import connection, transaction

    from chat.models import ChatMessage

    rare = rare_positions(layout.total)
    ids = (
        ChatMessage.objects.filter(session__owner=user)
        .order_by("id")
        .values_list("id", flat=True)
        .iterator(chunk_size=20_000)
    )
    updates: list[tuple[str, int]] = []
    planted = 0

    def flush() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.executemany("UPDATE chat_messages SET content = %s WHERE id = %s", updates)
        updates.clear()

    for position, message_id in enumerate(ids):
        text = planted_content(position, rare)
        if text is not None:
            updates.append((text, message_id))
            planted += 1
            if len(updates) >= PLANT_BATCH:
                flush()
    if updates:
        flush()
    return planted


def prepare(*, layout: str, label: str) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from rest_framework.authtoken.models import Token

    from chat.management.commands.seed_demo import DEFAULT_SEED, seed_session
    from chat.models import ChatSession

    users = parse_layout(layout)
    state = status(layout=layout)
    if state["state"] == "other":
        raise SystemExit("the database holds other data: drop it first (--search-reseed)")
    build: dict[str, Any] = state.get("build") or {}
    user_model = get_user_model()
    if state["state"] == "empty":
        started = time.perf_counter()
        build = {"users": {}, "built_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        accounts = {}
        for spec in users:
            accounts[spec.label] = user_model.objects.create(username=spec.username)
            accounts[spec.label].set_unusable_password()
            accounts[spec.label].save(update_fields=["password"])
            build["users"][spec.label] = {"messages": spec.total, "seed_seconds": 0.0}
        chats: dict[tuple[str, int], int] = {}
        for step in seeding_plan(users):
            label_n = (step.user.label, step.session)
            if step.user.sessions == 1 or step.session % 10 == 0:
                _log(f"[{label}] {step.user.username} #{step.session + 1}: +{step.messages:,}")
            t0 = time.perf_counter()
            result = seed_session(
                user=accounts[step.user.label],
                messages=step.messages,
                session_id=chats.get(label_n),
                title=f"{step.user.label} #{step.session + 1}",
                seed=DEFAULT_SEED + step.seed_offset,
            )
            chats[label_n] = result.session_id
            build["users"][step.user.label]["seed_seconds"] += time.perf_counter() - t0
        for spec in users:
            t1 = time.perf_counter()
            planted = _plant(user=accounts[spec.label], layout=spec)
            entry = build["users"][spec.label]
            entry["seed_seconds"] = round(entry["seed_seconds"], 1)
            entry["plant_seconds"] = round(time.perf_counter() - t1, 1)
            entry["planted"] = planted
            _log(
                f"[{label}] {spec.username}: seeded in {entry['seed_seconds']:.1f} s, "
                f"{planted:,} planted in {entry['plant_seconds']:.1f} s"
            )
        t2 = time.perf_counter()
        _log(f"[{label}] analyzing ...")
        statistics_refreshed()
        build["analyze_seconds"] = round(time.perf_counter() - t2, 1)
        build["total_seconds"] = round(time.perf_counter() - started, 1)
        marker_user = user_model.objects.create(username=MARKER_USER)
        ChatSession.objects.create(
            owner=marker_user, title=_marker_title(layout), context_summary=json.dumps(build)
        )
    out: dict[str, Any] = {"build": build, "users": {}}
    for spec in users:
        user = user_model.objects.get(username=spec.username)
        token, _ = Token.objects.get_or_create(user=user)
        sessions = list(
            ChatSession.objects.filter(owner=user).order_by("-id").values_list("id", flat=True)
        )
        out["users"][spec.label] = {"user_id": user.pk, "token": token.key, "sessions": sessions}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            out["server_version"] = f"PostgreSQL {cursor.fetchone()[0]}"
        else:
            cursor.execute("SELECT sqlite_version()")
            out["server_version"] = f"SQLite {cursor.fetchone()[0]}"
    return out


# --- in-process timings ------------------------------------------------------------------------


def _icontains(*, user: Any, session_id: int | None, query: str) -> list[Any]:
    """The plain scan the search is compared with: what a Django app writes first."""
    from chat.models import ChatMessage

    qs = ChatMessage.objects.filter(session__owner=user, content__icontains=query)
    if session_id is not None:
        qs = qs.filter(session_id=session_id)
    return list(qs.order_by("-id")[:PAGE])


def _rows_read(sql: str) -> int | None:
    """PostgreSQL: heap and index rows the statement's scans visited (EXPLAIN ANALYZE: rows
    returned plus rows removed by a filter or a recheck, times loops). None on SQLite."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    if not sql.lstrip().upper().startswith("SELECT"):
        return 0  # SET LOCAL statement_timeout
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    total = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal total
        kind = node["Node Type"]
        if kind.endswith("Scan") and kind != "Bitmap Index Scan" and "Subquery" not in kind:
            rows = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
            rows += node.get("Rows Removed by Index Recheck", 0)
            total += int(rows * node.get("Actual Loops", 1))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return total


def _cell_counts(*, cell: dict[str, Any], user: Any, session: Any, token: str) -> dict[str, Any]:
    """Queries per HTTP request, queries and rows of the selector and of icontains, and a check
    that the search's first page is the plain scan's first page."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from chat.search.selectors import message_search

    params = {"q": cell["query"], "limit": str(PAGE)}
    if session is not None:
        params["session_id"] = str(session.pk)
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    with CaptureQueriesContext(connection) as http:
        response = client.get("/api/v1/chat/search", params)
    if response.status_code == 503:  # the search's time limit: reported, not a failure here
        return {"http_queries": len(http.captured_queries), "timed_out": True}
    if response.status_code != 200:
        raise SystemExit(f"{cell['key']}: HTTP {response.status_code} {response.content[:300]!r}")
    with CaptureQueriesContext(connection) as ctx:
        page = message_search(user=user, query=cell["query"], session=session, limit=PAGE)
    with CaptureQueriesContext(connection) as scan_ctx:
        scanned = _icontains(user=user, session_id=cell["session_id"], query=cell["query"])
    found = [hit.message_id for hit in page.hits]
    if found != [m.pk for m in scanned][: len(found)]:
        raise SystemExit(f"{cell['key']}: the search's page is not the plain scan's")
    rows = [_rows_read(q["sql"]) for q in ctx.captured_queries]
    scan_rows = [_rows_read(q["sql"]) for q in scan_ctx.captured_queries]
    return {
        "timed_out": False,
        "http_queries": len(http.captured_queries),
        "queries": len(ctx.captured_queries),
        "rows": None if None in rows else sum(r or 0 for r in rows),
        "scan_rows": None if None in scan_rows else sum(r or 0 for r in scan_rows),
        "hits": len(found),
        "scan_hits": len(scanned),
        "mode": page.mode,
        "more": page.next_cursor is not None,
    }


def _walk(*, user: Any, session: Any, query: str) -> dict[str, Any]:
    """Follow next_cursor to the end: requests and time to find every match."""
    from chat.errors import SearchTimeout
    from chat.search.selectors import message_search

    started = time.perf_counter()
    cursor = None
    pages = hits = 0
    while pages < WALK_MAX_PAGES:
        try:
            page = message_search(
                user=user, query=query, session=session, cursor=cursor, limit=PAGE
            )
        except SearchTimeout:
            return {"pages": pages + 1, "hits": hits, "ms": float("nan"), "timed_out": True}
        pages += 1
        hits += len(page.hits)
        cursor = page.next_cursor
        if cursor is None:
            break
    return {"pages": pages, "hits": hits, "ms": (time.perf_counter() - started) * 1000}


def inside(*, plan: dict[str, Any]) -> dict[str, Any]:
    """Round-robin over the cells: the selector (`message_search`, as the API calls it) and the
    plain icontains scan, timed in this process on one connection."""
    from django.contrib.auth import get_user_model

    from chat.errors import SearchTimeout
    from chat.models import ChatSession
    from chat.search.selectors import message_search

    users = {u.pk: u for u in get_user_model().objects.filter(pk__in=plan["user_ids"])}
    cells = plan["cells"]
    sessions = {
        s.pk: s for s in ChatSession.objects.filter(pk__in=[c["session_id"] for c in cells])
    }
    out: dict[str, Any] = {
        c["key"]: {"selector": [], "icontains": [], "selector_timeouts": 0} for c in cells
    }
    for cell in cells:
        user, session = users[cell["user_id"]], sessions.get(cell["session_id"])
        out[cell["key"]].update(
            _cell_counts(cell=cell, user=user, session=session, token=cell["token"])
        )
        if cell["walk"] and not out[cell["key"]]["timed_out"]:
            out[cell["key"]]["walk"] = _walk(user=user, session=session, query=cell["query"])
    warmup, repeats, scan_repeats = plan["warmup"], plan["repeats"], plan["scan_repeats"]
    started = time.monotonic()
    for round_no in range(warmup + max(repeats, scan_repeats)):
        for cell in cells:
            user, session = users[cell["user_id"]], sessions.get(cell["session_id"])
            if round_no < warmup + repeats:
                t0 = time.perf_counter()
                try:
                    message_search(user=user, query=cell["query"], session=session, limit=PAGE)
                except SearchTimeout:
                    out[cell["key"]]["selector_timeouts"] += round_no >= warmup
                if round_no >= warmup:
                    out[cell["key"]]["selector"].append((time.perf_counter() - t0) * 1000)
            if round_no < warmup + scan_repeats:
                t0 = time.perf_counter()
                _icontains(user=user, session_id=cell["session_id"], query=cell["query"])
                if round_no >= warmup:
                    out[cell["key"]]["icontains"].append((time.perf_counter() - t0) * 1000)
        if round_no == warmup:
            elapsed = time.monotonic() - started
            _log(f"  first round {elapsed:.1f} s; ~{elapsed * (repeats + 1):.0f} s to go")
    for key, values in out.items():
        med = statistics.median(values["icontains"]) if values["icontains"] else 0
        selector = statistics.median(values["selector"])
        _log(f"  {key}: selector {selector:.1f} ms, icontains {med:.0f} ms")
    return out


def explain(*, user_label: str, query: str, session: bool) -> str:
    """The plans of one search's statements (EXPLAIN ANALYZE / EXPLAIN QUERY PLAN), for
    looking into a slow cell."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from chat.models import ChatSession
    from chat.search.selectors import message_search

    user = get_user_model().objects.get(username=f"search-{user_label}")
    chat = ChatSession.objects.filter(owner=user).order_by("-id").first() if session else None
    with CaptureQueriesContext(connection) as ctx:
        message_search(user=user, query=query, session=chat, limit=PAGE)
    lines = []
    for captured in ctx.captured_queries:
        sql = captured["sql"]
        lines += ["", sql, f"-- {float(captured['time']) * 1000:.1f} ms"]
        if not sql.lstrip().upper().startswith("SELECT"):
            continue
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                lines += [row[0] for row in cursor.fetchall()]
            else:
                cursor.execute("EXPLAIN QUERY PLAN " + sql)
                lines += [" ".join(str(col) for col in row) for row in cursor.fetchall()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.search_worker")
    sub = parser.add_subparsers(dest="task", required=True)
    for name in ("status", "prepare"):
        p = sub.add_parser(name)
        p.add_argument("--layout", required=True)
        p.add_argument("--label", default="")
    sub.add_parser("inside")
    p = sub.add_parser("explain")
    p.add_argument("--user", required=True, help="layout label, e.g. 1000000")
    p.add_argument("--q", required=True)
    p.add_argument("--session", action="store_true", help="in the user's newest session")
    args = parser.parse_args()
    _setup()
    result: Any
    if args.task == "status":
        result = status(layout=args.layout)
    elif args.task == "prepare":
        result = prepare(layout=args.layout, label=args.label)
    elif args.task == "explain":
        print(explain(user_label=args.user, query=args.q, session=args.session))
        return
    else:
        result = inside(plan=json.load(sys.stdin))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
