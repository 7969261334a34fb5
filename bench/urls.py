"""Bench-only URLconf (CADAU_URLCONF=bench.urls): the real app, plus an OFFSET-paged copy of the
history endpoint so both can be measured by the same server on the same data."""

from __future__ import annotations

from django.urls import path

from bench.offset_app import OffsetHistoryView
from cadau.urls import urlpatterns as app_urlpatterns

urlpatterns = [
    path("bench/offset-history", OffsetHistoryView.as_view(), name="bench-offset-history"),
    *app_urlpatterns,
]
