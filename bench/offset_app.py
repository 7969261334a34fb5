"""The baseline the keyset history API is measured against: the page-number/OFFSET pattern
most paginators default to (a COUNT for the total, then ORDER BY id LIMIT 50 OFFSET n). It lives
only in the benchmark; the app never pages with OFFSET.

Same authentication, ownership check and message serializer as the real endpoint, so
the difference in the table is the query shape, not the framework around it."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chat.api.serializers import MessageSerializer
from chat.models import ChatMessage
from chat.selectors import session_for_user

MAX_LIMIT = 200


def _int(value: str | None, *, default: int, low: int, high: int) -> int:
    try:
        return min(max(int(value), low), high) if value is not None else default
    except ValueError:
        return default


class OffsetHistoryView(APIView):
    def get(self, request: Request) -> Response:
        session = session_for_user(
            user=request.user, session_id=request.query_params.get("session_id")
        )
        limit = _int(request.query_params.get("limit"), default=50, low=1, high=MAX_LIMIT)
        offset = _int(request.query_params.get("offset"), default=0, low=0, high=2**62)
        qs = ChatMessage.objects.filter(session=session).order_by("id")
        total = qs.count()
        rows = list(qs[offset : offset + limit])
        return Response(
            {"count": total, "offset": offset, "messages": MessageSerializer(rows, many=True).data}
        )
