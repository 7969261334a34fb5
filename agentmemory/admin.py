"""The flush ledger in the admin: read-only, it is an audit trail written by the flush only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from agentmemory.models import MemoryFlush


@admin.register(MemoryFlush)
class MemoryFlushAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "session",
        "agent",
        "from_message_id",
        "to_message_id",
        "message_count",
        "runes",
        "note_date",
        "note_status",
        "extract_status",
        "entries_written",
        "attempts",
        "created_at",
    )
    list_filter = ("note_status", "extract_status")
    list_select_related = ("session", "agent")
    raw_id_fields = ("session", "agent")
    search_fields = ("note_heading", "error")
    readonly_fields = [f.name for f in MemoryFlush._meta.fields]
    show_full_result_count = False
    ordering = ("-id",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
