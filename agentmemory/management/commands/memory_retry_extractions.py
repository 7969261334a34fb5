from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agentmemory.flush import MAX_EXTRACT_ATTEMPTS, memory_retry_extractions


class Command(BaseCommand):
    help = (
        "Retry failed long-term-memory extractions of flushed compaction batches "
        f"(each at most {MAX_EXTRACT_ATTEMPTS} times in all). Safe to run from cron."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--limit", type=int, default=100)

    def handle(self, *args: Any, **options: Any) -> None:
        tried, succeeded = memory_retry_extractions(limit=options["limit"])
        self.stdout.write(f"retried {tried} extraction(s), {succeeded} succeeded")
