"""`python manage.py fakellm --port 8765 [--host 127.0.0.1] [--token-ms 20]`

Runs the fake OpenAI-compatible server in the foreground, for local demos and benchmarks:
point LLM_BASE_URL at the printed URL. Drive it through its /_control/ endpoints.
"""

from __future__ import annotations

import gc
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from devtools.fakellm import FakeLLMServer


class Command(BaseCommand):
    help = "Run the fake OpenAI-compatible LLM server in the foreground."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8765)
        parser.add_argument(
            "--token-ms", type=float, default=0.0, help="delay between streamed tokens (ms)"
        )
        parser.add_argument(
            "--reply-words",
            type=int,
            default=0,
            help="pad default chat replies to this many words (fixed-size replies for benchmarks)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            server = FakeLLMServer(
                host=options["host"], port=options["port"], token_ms=options["token_ms"]
            )
        except OSError as exc:
            raise CommandError(
                f"cannot listen on {options['host']}:{options['port']}: {exc}"
            ) from exc
        if options["reply_words"]:
            server.configure(reply_words=options["reply_words"])
        self.stdout.write(
            f"Fake LLM server on {server.base_url} (token every {options['token_ms']:g} ms).\n"
            f"  LLM_BASE_URL={server.base_url} LLM_MODEL=fake-chat\n"
            f"  control: POST {server.url}/_control/script|fault|config|reset, "
            f"GET {server.url}/_control/calls\n"
            "Ctrl-C to stop."
        )
        # Django and the server, loaded by now, live as long as the process: out of the cyclic
        # collector's sight, so that a full collection does not stall a streamed reply that a
        # benchmark is timing (as cadau/asgi.py does for the app).
        gc.collect()
        gc.freeze()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
