"""GET /api/v1/chat/search: the caller's messages containing a text, newest first."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chat.api import serializers as s
from chat.api.common import cursor_errors, error_responses, valid
from chat.api.throttles import API_THROTTLES, per_user
from chat.search.selectors import message_search
from chat.selectors import session_for_user


class SearchView(APIView):
    throttle_classes = [*API_THROTTLES, per_user("message_search", methods=("GET",))]

    @extend_schema(
        operation_id="chat_search",
        parameters=[s.SearchQuerySerializer],
        responses={
            200: s.SearchPageSerializer,
            **error_responses(400, 403, 404),
            503: OpenApiResponse(s.ErrorSerializer, description="The search took too long."),
        },
        description=(
            "Case-insensitive substring search over the caller's own messages (all sessions, or "
            "`session_id`'s), newest first, keyset-paged by `before` = `next_cursor`."
        ),
    )
    def get(self, request: Request) -> Response:
        query = valid(s.SearchQuerySerializer, request.query_params)
        session = None
        if "session_id" in query:
            session = session_for_user(user=request.user, session_id=query["session_id"])
        with cursor_errors():
            page = message_search(
                user=request.user,
                query=query["q"],
                session=session,
                role=query.get("role"),
                cursor=query.get("before"),
                limit=query["limit"],
            )
        results = [
            {
                "session_id": hit.session_id,
                "session_title": hit.session_title,
                "message_id": hit.message_id,
                "role": hit.role,
                "created_at": hit.created_at,
                "snippet": hit.snippet,
                "highlights": [list(pair) for pair in hit.highlights],
            }
            for hit in page.hits
        ]
        return Response(
            {
                "results": s.SearchHitSerializer(results, many=True).data,
                "next_cursor": page.next_cursor,
                "mode": page.mode,
            }
        )
