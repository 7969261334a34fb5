"""GET /api/v1/chat/sessions/{id}/export?format=markdown|json: a whole session as a download.

The response streams: the session is walked by message id a batch at a time in a worker thread
(chat/selectors.session_message_batch), each batch rendered and encoded there too and written
before the next is read, so a session of a million messages exports in the memory of one
batch. The iterator is async because Django serves a synchronous one under ASGI by reading it
whole first. Rendering on the event loop stalled every other request of the process (a probe:
1.4 s a batch of long messages), and batches of 500 such messages took ~750 MB."""

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
from chat.api.common import query_once_each
from chat.api.errors import ApiError
from chat.api.throttles import API_THROTTLES, per_user
from chat.markdown_text import markdown_code_span, markdown_fenced, markdown_plain
from chat.models import ChatMessage, ChatSession, MessageStatus
from chat.selectors import session_for_user, session_last_message_id, session_message_batch
from chat.shapes import message_payload
from chat.workers import in_worker

# Messages per batch: a message may hold CHAT_MAX_MESSAGE_RUNES (200,000) runes.
EXPORT_BATCH = 100
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
    after = 0
    while True:
        chunk, last, read = await in_worker(_batch_rendered)(
            session_id=session.pk,
            after_id=after,
            through_id=through,
            render=render,
            json_list=json_list,
        )
        if read:
            yield chunk
            after = last
        if read < EXPORT_BATCH:
            break
    yield tail.encode()


def _batch_rendered(
    *,
    session_id: int,
    after_id: int,
    through_id: int,
    render: Callable[[ChatMessage], str],
    json_list: bool,
) -> tuple[bytes, int, int]:
    """The batch after `after_id`, rendered and encoded, its last id and how many messages it
    read."""
    batch = session_message_batch(
        session_id=session_id, after_id=after_id, through_id=through_id, limit=EXPORT_BATCH
    )
    pieces = [render(message) for message in batch]
    # JSON items are comma-separated, and a batch after another opens with one.
    separator = "," if json_list else ""
    text = (separator if after_id and pieces else "") + separator.join(pieces)
    return text.encode(), (batch[-1].pk if batch else after_id), len(batch)


def _json_message(message: ChatMessage) -> str:
    return "\n" + json.dumps(message_payload(message), ensure_ascii=False)


class _FormatIsTheFiles(DefaultContentNegotiation):
    """`?format=` names the download's format here, where DRF would read it as a renderer's
    name and answer 404 for `markdown`. Errors are JSON, like every other route's."""

    def select_renderer(self, request: Any, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


class SessionExportView(APIView):
    content_negotiation_class = _FormatIsTheFiles
    throttle_classes = [*API_THROTTLES, per_user("session_export", methods=("GET",))]

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
        query_once_each(request.query_params)
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
