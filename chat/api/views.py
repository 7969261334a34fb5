"""Thin HTTP layer: validate the request, resolve ownership through `session_for_user` (Http404
for anything not the caller's), call one selector or service, serialize."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from chat.api import serializers as s
from chat.api.errors import ApiError
from chat.cursors import InvalidCursor
from chat.rendering import render_markdown
from chat.selectors import (
    history_page,
    session_for_user,
    session_list,
    session_snapshots,
    turns_page,
)
from chat.services.budget import context_budget_for
from chat.services.sessions import (
    message_truncate,
    session_create,
    session_delete,
    session_update,
)

_ERRORS = {
    400: OpenApiResponse(s.ErrorSerializer, description="Invalid input."),
    403: OpenApiResponse(s.ErrorSerializer, description="Not authenticated."),
    404: OpenApiResponse(s.ErrorSerializer, description="Not found (or not yours)."),
}
_SESSION_ID_PATH = OpenApiParameter(
    "session_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="Session id."
)


def _errors(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: _ERRORS[code] for code in codes}


def _valid(serializer_class: type[Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


@contextmanager
def _cursor_errors() -> Iterator[None]:
    try:
        yield
    except InvalidCursor as exc:
        raise ApiError(str(exc), code="invalid_cursor") from exc


class SessionListCreateView(APIView):
    @extend_schema(
        operation_id="chat_sessions_list",
        parameters=[s.SessionListQuerySerializer],
        responses={200: s.SessionPageSerializer, **_errors(400, 403)},
        description="The caller's sessions, newest activity first, keyset-paged.",
    )
    def get(self, request: Request) -> Response:
        query = _valid(s.SessionListQuerySerializer, request.query_params)
        with _cursor_errors():
            page = session_list(user=request.user, limit=query["limit"], cursor=query.get("cursor"))
        return Response(
            {
                "results": s.SessionSerializer(page.sessions, many=True).data,
                "next_cursor": page.next_cursor,
            }
        )

    @extend_schema(
        operation_id="chat_sessions_create",
        request=s.SessionCreateSerializer,
        responses={201: s.SessionSerializer, **_errors(400, 403, 404)},
    )
    def post(self, request: Request) -> Response:
        data = _valid(s.SessionCreateSerializer, request.data)
        session = session_create(
            user=request.user, title=data.get("title", ""), agent_id=data.get("agent_id")
        )
        return Response(s.SessionSerializer(session).data, status=status.HTTP_201_CREATED)


class SessionDetailView(APIView):
    @extend_schema(
        operation_id="chat_sessions_retrieve",
        parameters=[_SESSION_ID_PATH],
        responses={200: s.SessionSerializer, **_errors(403, 404)},
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = session_for_user(user=request.user, session_id=session_id)
        return Response(s.SessionSerializer(session).data)

    @extend_schema(
        operation_id="chat_sessions_update",
        parameters=[_SESSION_ID_PATH],
        request=s.SessionUpdateSerializer,
        responses={200: s.SessionSerializer, **_errors(400, 403, 404)},
    )
    def patch(self, request: Request, session_id: str) -> Response:
        session = session_for_user(user=request.user, session_id=session_id)
        data = _valid(s.SessionUpdateSerializer, request.data)
        session = session_update(session=session, title=data["title"])
        return Response(s.SessionSerializer(session).data)

    @extend_schema(
        operation_id="chat_sessions_destroy",
        parameters=[_SESSION_ID_PATH],
        responses={204: None, **_errors(403, 404)},
        description="Deletes the session with all its messages and context snapshots.",
    )
    def delete(self, request: Request, session_id: str) -> Response:
        session = session_for_user(user=request.user, session_id=session_id)
        session_delete(session=session)
        return Response(status=status.HTTP_204_NO_CONTENT)


class HistoryView(APIView):
    @extend_schema(
        operation_id="chat_history",
        parameters=[s.HistoryQuerySerializer],
        responses={200: s.HistoryPageSerializer, **_errors(400, 403, 404)},
        description=(
            "One page of messages, oldest first. No position: the newest page. `before` / "
            "`after` take older_cursor / newer_cursor of a previous page; `around` a message id."
        ),
    )
    def get(self, request: Request) -> Response:
        query = _valid(s.HistoryQuerySerializer, request.query_params)
        session = session_for_user(user=request.user, session_id=query["session_id"])
        with _cursor_errors():
            page = history_page(
                session=session,
                limit=query["limit"],
                before=query.get("before", query.get("cursor")),
                after=query.get("after"),
                around=query.get("around"),
            )
        messages = s.MessageSerializer(page.messages, many=True).data
        if query.get("render") == "html":
            # The chat page shows server-rendered, sanitised Markdown (chat/rendering.py).
            for item, message in zip(messages, page.messages, strict=True):
                item["content_html"] = render_markdown(message.content)
        return Response(
            {
                "messages": messages,
                "older_cursor": page.older_cursor,
                "newer_cursor": page.newer_cursor,
                "at_live_edge": page.at_live_edge,
                "next_cursor": page.older_cursor,
            }
        )


class TurnsView(APIView):
    @extend_schema(
        operation_id="chat_history_turns",
        parameters=[s.TurnsQuerySerializer],
        responses={200: s.TurnsPageSerializer, **_errors(400, 403, 404)},
        description="The user's questions in the session, newest first (a navigator index).",
    )
    def get(self, request: Request) -> Response:
        query = _valid(s.TurnsQuerySerializer, request.query_params)
        session = session_for_user(user=request.user, session_id=query["session_id"])
        with _cursor_errors():
            page = turns_page(session=session, limit=query["limit"], cursor=query.get("cursor"))
        turns = [
            {"message_id": t.message_id, "created_at": t.created_at, "preview": t.preview}
            for t in page.turns
        ]
        return Response(
            {
                "turns": s.TurnSerializer(turns, many=True).data,
                "next_cursor": page.next_cursor,
            }
        )


class TruncateView(APIView):
    @extend_schema(
        operation_id="chat_truncate",
        request=s.TruncateRequestSerializer,
        responses={200: s.TruncateResponseSerializer, **_errors(400, 403, 404)},
        description="Deletes the message and every later one (edit and resend).",
    )
    def post(self, request: Request) -> Response:
        data = _valid(s.TruncateRequestSerializer, request.data)
        session = session_for_user(user=request.user, session_id=data["session_id"])
        result = message_truncate(session=session, message_id=data["message_id"])
        return Response(
            {
                "deleted": result.deleted,
                "summary_rewound": result.summary_rewound,
                "context_budget": context_budget_for(session=result.session),
            }
        )


class SessionContextView(APIView):
    @extend_schema(
        operation_id="chat_session_context",
        parameters=[_SESSION_ID_PATH, s.ContextQuerySerializer],
        responses={200: s.SessionContextSerializer, **_errors(400, 403, 404)},
        description="The rolling summary, its anchor, the budget and the newest snapshots.",
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = session_for_user(user=request.user, session_id=session_id)
        query = _valid(s.ContextQuerySerializer, request.query_params)
        snapshots = session_snapshots(session=session, limit=query["snapshots_limit"])
        return Response(
            {
                "context_summary": session.context_summary,
                "verbatim_since_message_id": session.verbatim_since_message_id,
                "context_budget": context_budget_for(session=session),
                "snapshots": s.SnapshotSerializer(snapshots, many=True).data,
            }
        )


class TokenView(ObtainAuthToken):
    """POST username + password → {"token"}; send it as `Authorization: Token <key>`."""

    # Credentials are the authentication here; a browser session cookie must not make this
    # endpoint demand a CSRF token from scripts.
    authentication_classes = ()

    @extend_schema(
        operation_id="auth_token",
        request=s.TokenRequestSerializer,
        responses={200: s.TokenResponseSerializer, **_errors(400)},
        auth=[],
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().post(request, *args, **kwargs)
