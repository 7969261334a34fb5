"""/api/v1/agents/{id}/memory/... routes (mounted by cadau/urls.py beside chat's)."""

from django.urls import path

from agentmemory import api

urlpatterns = [
    path(
        "agents/<str:agent_id>/memory/daily",
        api.DailyNoteView.as_view(),
        name="agent-memory-daily",
    ),
    path(
        "agents/<str:agent_id>/memory/entries",
        api.EntryListCreateView.as_view(),
        name="agent-memory-entries",
    ),
    path(
        # path: a name with "/" reaches the store, which refuses it in the JSON error shape.
        "agents/<str:agent_id>/memory/entries/<path:name>",
        api.EntryDetailView.as_view(),
        name="agent-memory-entry",
    ),
]
