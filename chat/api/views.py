"""Thin HTTP layer: validate the request, resolve ownership through `session_for_user` (a 404
for anything not the caller's), call one selector or service, serialize."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.authentication import BaseAuthentication
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from cadau.logins import login_attempt_wait, login_success_record
from cadau.tokens import token_issue, token_revoke
from chat.api import serializers as s
from chat.api.common import cursor_errors, error_responses, valid
from chat.api.parsers import JSONParser
from chat.api.throttles import API_THROTTLES, per_user
from chat.rendered import page_html
from chat.selectors import (
    history_page,
    session_budget,
    session_for_user,
    session_list,
    session_opened_for_user,
    session_snapshots,
    session_snapshots_page,
    session_summary_heading,
    turns_page,
)
from chat.services.sessions import (
    session_create,
    session_model_set,
    session_update,
)
from chat.turn.truncate import turn_session_delete, turn_truncate

_SESSION_ID_PATH = OpenApiParameter(
    "session_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="Session id."
)


class SessionListCreateView(APIView):
    throttle_classes = [*API_THROTTLES, per_user("session_create")]

    @extend_schema(
        operation_id="chat_sessions_list",
        parameters=[s.SessionListQuerySerializer],
        responses={200: s.SessionPageSerializer, **error_responses(400, 403)},
        description="The caller's sessions, newest activity first, keyset-paged.",
    )
    def get(self, request: Request) -> Response:
        query = valid(s.SessionListQuerySerializer, request.query_params)
        with cursor_errors():
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
        responses={201: s.SessionSerializer, **error_responses(400, 403, 404)},
    )
    def post(self, request: Request) -> Response:
        data = valid(s.SessionCreateSerializer, request.data)
        session = session_create(
            user=request.user, title=data.get("title", ""), agent_id=data.get("agent_id")
        )
        return Response(s.SessionSerializer(session).data, status=status.HTTP_201_CREATED)


class SessionDetailView(APIView):
    throttle_classes = [*API_THROTTLES, per_user("session_update", methods=("PATCH",))]

    @extend_schema(
        operation_id="chat_sessions_retrieve",
        parameters=[_SESSION_ID_PATH],
        responses={200: s.SessionSerializer, **error_responses(403, 404)},
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = session_for_user(user=request.user, session_id=session_id)
        return Response(s.SessionSerializer(session).data)

    @extend_schema(
        operation_id="chat_sessions_update",
        parameters=[_SESSION_ID_PATH],
        request=s.SessionUpdateSerializer,
        responses={200: s.SessionSerializer, **error_responses(400, 403, 404)},
    )
    def patch(self, request: Request, session_id: str) -> Response:
        session = session_for_user(user=request.user, session_id=session_id)
        data = valid(s.SessionUpdateSerializer, request.data)
        with transaction.atomic():
            # The model first: a refused one leaves the title unchanged too.
            if "model" in data:
                session = session_model_set(session=session, model=data["model"])
            if "title" in data:
                session = session_update(session=session, title=data["title"])
        return Response(s.SessionSerializer(session).data)

    @extend_schema(
        operation_id="chat_sessions_destroy",
        parameters=[_SESSION_ID_PATH],
        responses={204: None, **error_responses(403, 404)},
        description="Deletes the session with all its messages and context snapshots.",
    )
    def delete(self, request: Request, session_id: str) -> Response:
        turn_session_delete(user=request.user, session_id=session_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class HistoryView(APIView):
    @extend_schema(
        operation_id="chat_history",
        parameters=[s.HistoryQuerySerializer],
        responses={200: s.HistoryPageSerializer, **error_responses(400, 403, 404)},
        description=(
            "One page of messages, oldest first. No position: the newest page. `before` / "
            "`after` take older_cursor / newer_cursor of a previous page; `around` a message id."
        ),
    )
    def get(self, request: Request) -> Response:
        query = valid(s.HistoryQuerySerializer, request.query_params)
        # The newest page: the chat was just opened, a send is likely to follow.
        newest = not any(query.get(k) is not None for k in ("before", "cursor", "after", "around"))
        opened = session_opened_for_user if newest else session_for_user
        session = opened(user=request.user, session_id=query["session_id"])
        with cursor_errors():
            page = history_page(
                session=session,
                limit=query["limit"],
                before=query.get("before", query.get("cursor")),
                after=query.get("after"),
                around=query.get("around"),
            )
        messages = s.MessageSerializer(page.messages, many=True).data
        if query.get("render") == "html":
            # The chat page shows replies as server-rendered, sanitised Markdown
            # (chat/rendering.py), and everything else as text: only replies are rendered
            # (rendering costs with the text, and a user's own message can be 200,000 runes).
            for item, rendered in zip(messages, page_html(page.messages), strict=True):
                if rendered is not None:
                    item["content_html"] = rendered
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
        responses={200: s.TurnsPageSerializer, **error_responses(400, 403, 404)},
        description="The user's questions in the session, newest first (a navigator index).",
    )
    def get(self, request: Request) -> Response:
        query = valid(s.TurnsQuerySerializer, request.query_params)
        session = session_for_user(user=request.user, session_id=query["session_id"])
        with cursor_errors():
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
        responses={200: s.TruncateResponseSerializer, **error_responses(400, 403, 404)},
        description=(
            "Deletes the message and every later one (edit and resend). A reply still being "
            "generated is stopped first (its `done`, status `cancelled`, goes to the session's "
            "sockets as for any cancel) and named in `cancelled_reply_id`."
        ),
    )
    def post(self, request: Request) -> Response:
        data = valid(s.TruncateRequestSerializer, request.data)
        truncated = turn_truncate(
            user=request.user, session_id=data["session_id"], message_id=data["message_id"]
        )
        result = truncated.result
        return Response(
            {
                "deleted": result.deleted,
                "summary_rewound": result.summary_rewound,
                "cancelled_reply_id": truncated.cancelled_reply_id,
                "context_budget": session_budget(session=result.session),
            }
        )


class SessionContextView(APIView):
    @extend_schema(
        operation_id="chat_session_context",
        parameters=[_SESSION_ID_PATH, s.ContextQuerySerializer],
        responses={200: s.SessionContextSerializer, **error_responses(400, 403, 404)},
        description="The rolling summary, its anchor, the budget and the newest snapshots.",
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = session_for_user(user=request.user, session_id=session_id)
        query = valid(s.ContextQuerySerializer, request.query_params)
        snapshots = session_snapshots(session=session, limit=query["snapshots_limit"])
        return Response(
            {
                "context_summary": session.context_summary,
                "verbatim_since_message_id": session.verbatim_since_message_id,
                "context_budget": session_budget(session=session),
                "snapshots": s.SnapshotSerializer(
                    snapshots, many=True, context={"staff": request.user.is_staff}
                ).data,
            }
        )


class SessionSnapshotsView(APIView):
    throttle_classes = [*API_THROTTLES, per_user("context_read", methods=("GET",))]

    @extend_schema(
        operation_id="chat_session_snapshots",
        parameters=[_SESSION_ID_PATH, s.SnapshotsQuerySerializer],
        responses={200: s.SnapshotsPageSerializer, **error_responses(400, 403, 404)},
        description=(
            "Read-only compaction history: the summary in force (as the model is sent it) and "
            "the session's snapshots with their ranges and times, newest first, paged by id."
        ),
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = session_for_user(user=request.user, session_id=session_id)
        query = valid(s.SnapshotsQuerySerializer, request.query_params)
        snapshots, next_before = session_snapshots_page(
            session=session, limit=query["limit"], before=query.get("before")
        )
        return Response(
            {
                "summary": {
                    "text": session.context_summary,
                    "heading": session_summary_heading(session=session),
                    "verbatim_since_message_id": session.verbatim_since_message_id,
                },
                "snapshots": s.SnapshotSerializer(
                    snapshots, many=True, context={"staff": request.user.is_staff}
                ).data,
                "next_before": next_before,
            }
        )


class TokenView(ObtainAuthToken):
    """POST username + password → {"token"}; send it as `Authorization: Token <key>`.
    DELETE revokes the caller's token. POSTs are rate-limited per address and per username,
    and a (username, address) pair with repeated failures is locked out (cadau/logins.py)."""

    # Counted in post() by cadau.logins.login_attempt_wait, as the login form counts: the
    # lockout first, then the address, then the username (DRF's throttles would count a
    # locked-out attempt against the username's limit, which every address shares).
    throttle_classes: list[type[BaseThrottle]] = []
    # ObtainAuthToken names DRF's own JSON parser; ours refuses deep nesting, NUL and lone
    # surrogates with a 400 (chat/text.py) where DRF's would fail deeper in with a 500.
    parser_classes = (FormParser, MultiPartParser, JSONParser)

    def get_authenticators(self) -> list[BaseAuthentication]:
        # POST: the credentials are the authentication; a browser session cookie must not
        # make it demand a CSRF token from scripts. DELETE: the usual token or session (with
        # its CSRF check, so another site cannot revoke a user's token).
        if getattr(self.request, "method", None) == "POST":
            return []
        classes: list[type[BaseAuthentication]] = api_settings.DEFAULT_AUTHENTICATION_CLASSES  # type: ignore[assignment]
        return [auth() for auth in classes]

    def get_permissions(self) -> list[BasePermission]:
        if getattr(self.request, "method", None) == "POST":
            return []
        return [IsAuthenticated()]

    @extend_schema(
        operation_id="auth_token",
        request=s.TokenRequestSerializer,
        responses={200: s.TokenResponseSerializer, **error_responses(400)},
        auth=[],
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        username = request.data.get("username") if isinstance(request.data, dict) else None
        refused = login_attempt_wait(request=request, username=username)
        if refused is not None:
            wait, reason = refused
            if reason == "login_locked":
                raise exceptions.Throttled(
                    wait=wait,
                    detail="Too many failed logins for this username from this address.",
                    code="login_locked",
                )
            raise exceptions.Throttled(wait=wait)
        # A failure is counted by the user_login_failed signal authenticate() sends.
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        login_success_record(request=request, username=username)
        token = token_issue(user=serializer.validated_data["user"])
        return Response({"token": token.key})

    @extend_schema(
        operation_id="auth_token_revoke",
        request=None,
        responses={204: None, **error_responses(403)},
        description="Revokes the caller's token; logging in again issues a new one.",
    )
    def delete(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        token_revoke(user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
