"""Inside a benchmark worker (Django set up): the database as autovacuum would have left it."""

from __future__ import annotations


def statistics_refreshed(*, tables: tuple[str, ...] = ("chat_messages", "chat_sessions")) -> None:
    """Fresh planner statistics; on PostgreSQL also the visibility map (index-only scans), the
    GIN pending list merged and dead row versions cleared, as autovacuum would by now (this
    machine's PostgreSQL runs without it)."""
    from django.db import connection  # the worker sets Django up first

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for table in tables:
                cursor.execute(f"VACUUM ANALYZE {table}")
        else:
            cursor.execute("ANALYZE")
