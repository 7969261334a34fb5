"""`python manage.py embeddings_backfill [--session ID ...]`

Semantic recall for messages written before an embedding model was configured (or while the
embedding server was down): embeds every message that has no vector of LLM_EMBEDDING_MODEL,
in batches, session by session. Safe to run again and beside a live server: a message embedded
meanwhile is skipped, one embedded twice is overwritten with the same vector.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from chat.search.semantic import embeddings_backfill


class Command(BaseCommand):
    help = "Embed the messages that have no vector of the configured embedding model."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--session", type=int, action="append", help="only this session (repeatable)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.LLM_EMBEDDING_MODEL:
            raise CommandError("LLM_EMBEDDING_MODEL is not set: semantic recall is off")
        sessions, embedded = embeddings_backfill(session_ids=options["session"])
        self.stdout.write(f"embeddings_backfill: {embedded} message(s) in {sessions} session(s)")
