"""GET /api/v1/chat/sessions/{id}/export?format=markdown|json: a whole session as a download.

The response streams: the session is walked by message id a batch at a time in a worker thread
(chat/selectors.session_message_batch), each batch rendered and written before the next is
read, so a session of a million messages exports in the memory of one batch. The iterator is
async because Django serves a synchronous one under ASGI by reading it whole first."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.views import APIView

from chat.api import serializers as s
from chat.api.errors import ApiError
from chat.api.throttles import per_user
from chat.markdown_text import markdown_code_span, markdown_fenced, markdown_plain
from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.selectors import session_for_user, session_last_message_id, session_message_batch
from chat.shapes import message_payload
from chat.workers import in_worker

EXPORT_BATCH = 500
FORMATS = ("markdown", "json")

_ROLE_HEADINGS = {"user": "User", "assistant": "Assistant", "tool": "Tool", "system": "System"}


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _markdown_head(session: ChatSession, exported_at: datetime) -> str:
    # One line: a title holding a newline must not add headings of its own.
    title = " ".join(session.title.split()) or f"Session {session.pk}"
    return f"# {title}\n\n_Exported from Cadau on {_utc(exported_at)}._\n"


def _markdown_message(message: ChatMessage) -> str:
    """A message under its own heading. Its text is Markdown when it cannot add or hide a
    heading (`_plain_markdown`), else it is fenced: a message or a tool's name must not make
    the export show turns that never happened."""
    heading = _ROLE_HEADINGS.get(message.role, message.role)
    if message.status != MessageStatus.COMPLETE:
        heading += f" ({message.status})"
    parts = [f"\n## {heading} · {_utc(message.created_at)}\n"]
    if message.content:
        content = message.content
        parts.append(f"\n{content if markdown_plain(content) else markdown_fenced(content)}\n")
    for call in message.tool_calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            function = {}
        name = markdown_code_span(str(function.get("name", "?")))
        arguments = function.get("arguments", "")
        parts.append(f"\n_Called {name} with:_\n\n{markdown_fenced(str(arguments))}\n")
    return "".join(parts)


def _json_head(session: ChatSession, exported_at: datetime) -> str:
    head = {
        "session": {
            "id": session.pk,
            "title": session.title,
            "agent_id": session.agent_id,
            "created_at": session.created_at.isoformat().replace("+00:00", "Z"),
        },
        "exported_at": exported_at.isoformat().replace("+00:00", "Z"),
    }
    # The object is left open: the messages array and the closing brace follow as they stream.
    return json.dumps(head, ensure_ascii=False)[:-1] + ', "messages": ['


async def _export_body(
    *,
    session: ChatSession,
    render: Callable[[ChatMessage], str],
    head: str,
    tail: str,
    json_list: bool,
) -> AsyncIterator[bytes]:
    through = await in_worker(session_last_message_id)(session_id=session.pk)
    yield head.encode()
    after, first = 0, True
    while True:
        batch: list[ChatMessage] = await in_worker(session_message_batch)(
            session_id=session.pk, after_id=after, through_id=through, limit=EXPORT_BATCH
        )
        if not batch:
            break
        rendered = []
        for message in batch:
            piece = render(message)
            if json_list and not first:
                piece = "," + piece
            first = False
            rendered.append(piece)
        yield "".join(rendered).encode()
        after = batch[-1].pk
        if len(batch) < EXPORT_BATCH:
            break
    yield tail.encode()


def _json_message(message: ChatMessage) -> str:
    return "\n" + json.dumps(message_payload(message), ensure_ascii=False)


class _FormatIsTheFiles(DefaultContentNegotiation):
    """`?format=` names the download's format here, where DRF would read it as a renderer's
    name and answer 404 for `markdown`. Errors are JSON, like every other route's."""

    def select_renderer(self, request: Any, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


class SessionExportView(APIView):
    content_negotiation_class = _FormatIsTheFiles
    throttle_classes = [per_user("session_export", methods=("GET",))]

    @extend_schema(
        operation_id="chat_session_export",
        parameters=[
            OpenApiParameter(
                "session_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="Session id."
            ),
            OpenApiParameter(
                "format",
                OpenApiTypes.STR,
                OpenApiParameter.QUERY,
                enum=list(FORMATS),
                description="markdown (default) or json.",
            ),
        ],
        responses={
            (200, "text/markdown"): OpenApiTypes.STR,
            (200, "application/json"): OpenApiTypes.OBJECT,
            400: OpenApiResponse(s.ErrorSerializer, description="Unknown format."),
            404: OpenApiResponse(s.ErrorSerializer, description="Not found (or not yours)."),
        },
        description=(
            "The whole session as a download, oldest message first, streamed in constant "
            "memory. JSON: {session, exported_at, messages: [message, ...]} with messages as "
            "the history API returns them. Messages stored after the export began are left out."
        ),
    )
    def get(self, request: Request, session_id: str) -> Any:
        session = session_for_user(user=request.user, session_id=session_id)
        fmt = request.query_params.get("format", "markdown")
        if fmt not in FORMATS:
            raise ApiError(
                f"format must be one of {', '.join(FORMATS)}, not {fmt[:40]!r}", code="invalid"
            )
        exported_at = datetime.now(UTC)
        json_list = fmt == "json"
        if json_list:
            render, head, tail = _json_message, _json_head(session, exported_at), "\n]}\n"
            content_type, extension = "application/json; charset=utf-8", "json"
        else:
            render, head, tail = _markdown_message, _markdown_head(session, exported_at), ""
            content_type, extension = "text/markdown; charset=utf-8", "md"
        body = _export_body(
            session=session, render=render, head=head, tail=tail, json_list=json_list
        )
        response = StreamingHttpResponse(body, content_type=content_type)
        # Only the id goes in the file name: a title could carry quotes or path characters.
        response["Content-Disposition"] = (
            f'attachment; filename="cadau-session-{session.pk}.{extension}"'
        )
        response["Cache-Control"] = "no-store"
        response["X-Content-Type-Options"] = "nosniff"
        return response
