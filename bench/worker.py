"""The Django half of the history benchmark, run as a subprocess with DATABASE_URL pointing at
one bench database (settings are per process, and the parent drives two databases):

    python -m bench.worker prepare --sizes 1000,100000 --builds .bench/builds.json
    python -m bench.worker count-queries < plan.json

Both print one JSON document on stdout; progress goes to stderr."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import django

from bench.dbstats import statistics_refreshed

BENCH_USER = "bench"
# Not a secret: a throwaway account in a throwaway database that only loopback can reach.
BENCH_PASSWORD = "bench-password-not-a-secret"


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cadau.settings")
    django.setup()


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prepare(*, sizes: list[int], builds_path: Path, label: str, rebuild: bool) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from chat.management.commands.seed_demo import seed_session
    from chat.models import ChatMessage, ChatSession

    # Cheap when nothing changed; needed when the cached database predates a new migration.
    call_command("migrate", verbosity=0, interactive=False)
    user, _ = get_user_model().objects.get_or_create(username=BENCH_USER)
    user.set_password(BENCH_PASSWORD)
    user.save(update_fields=["password"])

    builds: dict[str, Any] = json.loads(builds_path.read_text()) if builds_path.is_file() else {}
    sessions: dict[str, Any] = {}
    built_any = False
    for size in sizes:
        title = f"bench-{size}"
        existing = list(ChatSession.objects.filter(owner=user, title=title).order_by("id"))
        keep = existing[0] if existing and not rebuild else None
        # A build interrupted half-way leaves a short session: trust only a complete one.
        if keep is not None and (
            len(existing) > 1 or ChatMessage.objects.filter(session=keep).count() != size
        ):
            keep = None
        if keep is None:
            for stale in existing:
                ChatMessage.objects.filter(session=stale).delete()
                stale.delete()
            _log(f"[{label}] building a {size:,}-message session ...")
            step = max(size // 10, 5000)

            def progress(done: int, total: int, *, _step: int = step) -> None:
                if done % _step < 5000 or done == total:
                    _log(f"[{label}]   {done:,}/{total:,}")

            result = seed_session(user=user, messages=size, title=title, progress=progress)
            _log(f"[{label}]   {result.rate:,.0f} msg/s ({result.seconds:.1f} s)")
            builds[f"{label}:{size}"] = {
                "seconds": round(result.seconds, 2),
                "rate": round(result.rate),
                "built_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            }
            builds_path.write_text(json.dumps(builds, indent=2, sort_keys=True))
            keep = ChatSession.objects.get(pk=result.session_id)
            built_any = True
        ids = ChatMessage.objects.filter(session=keep).order_by("id").values_list("id", flat=True)
        sessions[str(size)] = {
            "session_id": keep.pk,
            "first_id": ids.first(),
            "last_id": ids.last(),
            "mid_id": ids[size // 2],
            "build": builds.get(f"{label}:{size}"),
        }
    if built_any:
        # Fresh statistics (and, on PostgreSQL, a visibility map so COUNT can use an index-only
        # scan): what a production database that autovacuum has seen would have.
        _log(f"[{label}] analyzing ...")
        statistics_refreshed()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            version = f"PostgreSQL {cursor.fetchone()[0]}"
        else:
            cursor.execute("SELECT sqlite_version()")
            version = f"SQLite {cursor.fetchone()[0]}"
    return {"sessions": sessions, "server_version": version}


def count_queries(*, plan: dict[str, Any]) -> dict[str, int]:
    """Queries per page as the view really runs them (authentication included), counted
    in-process: the number must not depend on the session size."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_AUTHORIZATION=f"Token {plan['token']}")
    counts: dict[str, int] = {}
    for key, path, params in plan["requests"]:
        client.get(path, params)  # warm: first-request imports and caches are not the page
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(path, params)
        if response.status_code != 200:
            raise SystemExit(f"{key}: HTTP {response.status_code}: {response.content[:300]!r}")
        counts[key] = len(ctx.captured_queries)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker")
    sub = parser.add_subparsers(dest="task", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--sizes", required=True)
    p.add_argument("--builds", type=Path, required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--rebuild", action="store_true")
    sub.add_parser("count-queries")
    args = parser.parse_args()
    _setup()
    if args.task == "prepare":
        result: Any = prepare(
            sizes=[int(s) for s in args.sizes.split(",")],
            builds_path=args.builds,
            label=args.label,
            rebuild=args.rebuild,
        )
    else:
        result = count_queries(plan=json.load(sys.stdin))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
