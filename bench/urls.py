"""Bench-only URLconf (CADAU_URLCONF=bench.urls): the real app, plus an OFFSET-paged copy of the
history endpoint so both can be measured by the same server on the same data, and a route that
answers once the server's background jobs are done (`python -m bench fidelity` waits on it
between turns, as a user who takes a moment to type lets a background compaction finish)."""

from __future__ import annotations

import time

from django.http import HttpRequest, JsonResponse
from django.urls import path

from bench.offset_app import OffsetHistoryView
from cadau.urls import urlpatterns as app_urlpatterns
from devtools.introspect import background_pending, background_wait


def background_idle(request: HttpRequest) -> JsonResponse:
    """Wait (up to `timeout` seconds, default 120) until no background job is pending, twice
    in a row a moment apart: a job may submit another as it ends. Answers how long it took."""
    try:
        timeout = min(600.0, max(0.0, float(request.GET.get("timeout", "120"))))
    except ValueError:
        return JsonResponse({"error": "timeout must be a number"}, status=400)
    started = time.monotonic()
    deadline = started + timeout
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
        background_wait(timeout=max(0.0, deadline - time.monotonic()))
        time.sleep(0.005)
        quiet = quiet + 1 if background_pending() == 0 else 0
    return JsonResponse(
        {"idle": background_pending() == 0, "waited_ms": (time.monotonic() - started) * 1000}
    )


urlpatterns = [
    path("bench/offset-history", OffsetHistoryView.as_view(), name="bench-offset-history"),
    path("bench/background-idle", background_idle, name="bench-background-idle"),
    *app_urlpatterns,
]
