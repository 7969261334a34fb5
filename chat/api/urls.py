"""/api/v1/ routes of chat. No trailing slashes: the paths are the contract in docs/api.md. Ids in
paths are matched as strings so a malformed id reaches session_for_user and becomes the same
JSON 404 as a missing one, instead of Django's HTML 404. An agent's memory routes are
agentmemory's (agentmemory/urls.py), mounted next to these by cadau/urls.py."""

from django.urls import path

from chat.api import agents, export, meta, search, send, views

urlpatterns = [
    path("auth/token", views.TokenView.as_view(), name="api-token"),
    path("status", meta.StatusView.as_view(), name="api-status"),
    path("chat/sessions", views.SessionListCreateView.as_view(), name="chat-sessions"),
    path(
        "chat/sessions/<str:session_id>",
        views.SessionDetailView.as_view(),
        name="chat-session-detail",
    ),
    path(
        "chat/sessions/<str:session_id>/context",
        views.SessionContextView.as_view(),
        name="chat-session-context",
    ),
    path(
        "chat/sessions/<str:session_id>/snapshots",
        views.SessionSnapshotsView.as_view(),
        name="chat-session-snapshots",
    ),
    path(
        "chat/sessions/<str:session_id>/export",
        export.SessionExportView.as_view(),
        name="chat-session-export",
    ),
    path("chat/history", views.HistoryView.as_view(), name="chat-history"),
    path("chat/search", search.SearchView.as_view(), name="chat-search"),
    path("chat/history/turns", views.TurnsView.as_view(), name="chat-history-turns"),
    path("chat/truncate", views.TruncateView.as_view(), name="chat-truncate"),
    path("chat/send", send.SendView.as_view(), name="chat-send"),
    path("chat/regenerate", send.RegenerateView.as_view(), name="chat-regenerate"),
    path(
        "chat/sessions/<str:session_id>/compact",
        send.CompactView.as_view(),
        name="chat-session-compact",
    ),
    path("agents", agents.AgentListCreateView.as_view(), name="agents"),
    path("agents/<str:agent_id>", agents.AgentDetailView.as_view(), name="agent-detail"),
]
